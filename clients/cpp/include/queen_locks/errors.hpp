// The exceptions of the queen_locks handle. Every one derives from
// queen_locks::Error, so a caller can catch them all in one place.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace queen_locks {

// Error is the base of everything the handle throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// InvalidArgument: a bad argument, refused before any request is sent.
// field() names the argument (name, n, ttl, wait, url, ...).
class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string field, const std::string& message)
      : Error(field + ": " + message), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

// Unavailable: the route did not answer (connection error, timeout, 502,
// 503, 504). The call may or may not have been applied; the handle keeps
// its owner, so calling again converges.
class Unavailable : public Error {
 public:
  explicit Unavailable(const std::string& message, long status = 0) : Error(message), status_(status) {}
  // The HTTP status when there was one, else 0.
  long status() const noexcept { return status_; }

 private:
  long status_;
};

// RouteError: the route refused the call (an HTTP status other than 200
// and the answer-less ones). Nothing of it was applied.
class RouteError : public Error {
 public:
  RouteError(long status, std::string message, std::string field, std::optional<int> index)
      : Error("the route answered " + std::to_string(status) + ": " + message),
        status_(status), message_(std::move(message)), field_(std::move(field)), index_(index) {}
  long status() const noexcept { return status_; }
  const std::string& message() const noexcept { return message_; }
  // The field of the operation the route found wrong, when it says.
  const std::string& field() const noexcept { return field_; }
  std::optional<int> index() const noexcept { return index_; }

 private:
  long status_;
  std::string message_, field_;
  std::optional<int> index_;
};

// LockLost: release() found that the permit was no longer ours (it
// expired, was deleted by hand, or was taken over).
class LockLost : public Error {
 public:
  LockLost(const std::string& name, const std::string& reason)
      : Error("lock \"" + name + "\" was lost (" + reason + ")"), name_(name), reason_(reason) {}
  const std::string& name() const noexcept { return name_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string name_, reason_;
};

}  // namespace queen_locks
