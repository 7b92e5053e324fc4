// The route transport: one lock operation per POST /api/v1/locks call,
// over libcurl. Safe for concurrent use: each call has its own curl handle.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "queen_locks/handle.hpp"
#include "token_file.hpp"

namespace queen_locks::detail {

using json = nlohmann::json;
using Millis = std::chrono::milliseconds;

constexpr const char* kRoutePath = "/api/v1/locks";
constexpr const char* kDefaultTokenFile = "/var/run/secrets/queen-locks/token";
// The longest wait one call may carry (waitSeconds 0 to 60).
constexpr int kMaxWaitSeconds = 60;
// How long an ordinary call may take before it counts as unanswered.
constexpr Millis kCallTimeout{30000};

// The route's full address: a bare server URL gets /api/v1/locks.
std::string route_url(const std::string& url);

// The holders and the guard of an answer, in the handle's types.
std::vector<Holder> holders_of(const json& result);
std::optional<Guard> guard_of(const json& result);

class Route {
 public:
  // token_file: a file the caller named (required to exist; empty for no
  // token), or nullopt for the default projected token, used when it
  // exists. ca_file: empty for the system's trust store.
  Route(const std::string& url, std::string ns, std::optional<std::string> token_file, std::string ca_file);

  const std::string& url() const { return url_; }
  const std::string& ns() const { return ns_; }
  // False once the route refused waitSeconds (a route from before it).
  bool takes_wait() const { return takes_wait_.load(); }

  // Sends one operation and answers its result. Throws Unavailable when
  // there was no answer, RouteError for a refusal, Error for anything else.
  json call(const json& op, Millis timeout) const;

  // acquire answers the result and the waitSeconds it asked for.
  std::pair<json, int> acquire(const std::string& name, const std::string& owner, std::int64_t ttl_seconds, int limit,
                               int wait_seconds) const;
  json renew(const std::string& name, int slot, std::uint64_t token, const std::string& owner,
             std::int64_t ttl_seconds, Millis timeout) const;
  json release(const std::string& name, int slot, std::uint64_t token, const std::string& owner,
               Millis timeout) const;
  json get(const std::string& name) const;
  json check(const std::string& name, int slot, std::uint64_t expect) const;

 private:
  std::string url_, ns_, ca_file_;
  mutable TokenFile token_;
  mutable std::atomic<bool> takes_wait_{true};
};

}  // namespace queen_locks::detail
