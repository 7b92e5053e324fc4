// Client: makes handles over the route (POST /api/v1/locks).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "queen_locks/handle.hpp"

namespace queen_locks {

// Options of a Client. A field left unset is taken from the environment:
// url from QUEEN_LOCKS_URL, token_file from QUEEN_LOCKS_TOKEN_FILE (else
// the projected token at /var/run/secrets/queen-locks/token when it
// exists), ca_file from QUEEN_LOCKS_CA_FILE; an empty variable counts as
// unset. A field set to an empty string means none, whatever the
// environment says.
struct Options {
  // The route: a bare http(s)://host:port gets /api/v1/locks.
  std::optional<std::string> url;
  // The namespace of the locks; empty leaves it to the route (the token's
  // ServiceAccount namespace).
  std::string namespace_;
  // A bearer token file, re-read whenever it changes (the kubelet rotates
  // projected tokens).
  std::optional<std::string> token_file;
  // The CA that verifies an https route.
  std::optional<std::string> ca_file;
};

// Client is cheap to copy and safe to share between threads; the handles
// it makes keep what they need, so they may outlive it.
class Client {
 public:
  // A client configured from the environment alone.
  Client();
  explicit Client(Options options);

  // A handle on the lock name: one holder at a time, for ttl (at least 1 s;
  // the server counts whole seconds, rounded up).
  Handle lock(std::string name, std::chrono::milliseconds ttl) const;
  // A handle on one of n permits of name.
  Handle semaphore(std::string name, int n, std::chrono::milliseconds ttl) const;
  // Like semaphore, with an owner of the caller's choosing (1 to 256 bytes):
  // for a holder that must come back as the same owner after a restart.
  Handle semaphore(std::string name, int n, std::chrono::milliseconds ttl, std::string owner) const;

  // Who holds name now.
  std::vector<Holder> holders(const std::string& name) const;

  // The route's full address, and the namespace asked for (may be empty).
  const std::string& url() const;
  const std::string& namespace_name() const;

 private:
  std::shared_ptr<detail::Route> route_;
};

}  // namespace queen_locks
