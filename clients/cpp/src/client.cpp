#include <cstdlib>

#include "queen_locks/client.hpp"
#include "route.hpp"
#include "validate.hpp"

namespace queen_locks {

namespace {

// The option when set (an empty one means none), else the environment
// variable when set and not empty, else nullopt.
std::optional<std::string> from(const std::optional<std::string>& option, const char* env) {
  if (option) return option;
  const char* v = std::getenv(env);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace

Client::Client() : Client(Options{}) {}

Client::Client(Options o) {
  auto url = from(o.url, "QUEEN_LOCKS_URL");
  // No token_file at all means the default projected token, when it exists.
  route_ = std::make_shared<detail::Route>(url.value_or(""), o.namespace_, from(o.token_file, "QUEEN_LOCKS_TOKEN_FILE"),
                                           from(o.ca_file, "QUEEN_LOCKS_CA_FILE").value_or(""));
}

Handle Client::lock(std::string name, std::chrono::milliseconds ttl) const { return semaphore(std::move(name), 1, ttl); }

Handle Client::semaphore(std::string name, int n, std::chrono::milliseconds ttl) const {
  return semaphore(std::move(name), n, ttl, detail::mint_owner());
}

const std::string& Client::url() const { return route_->url(); }
const std::string& Client::namespace_name() const { return route_->ns(); }

std::vector<Holder> Client::holders(const std::string& name) const {
  detail::validate_name(name);
  return detail::holders_of(route_->get(name));
}

}  // namespace queen_locks
