// Handle: one holder's lock or semaphore permit.
//
// C++ has no background thread here by design: the holder renews at a
// checkpoint, keep_alive(), called inside its work loop. It sends a renew
// only once a third of the lifetime has passed since the last renew (or the
// acquire) was sent, and answers false once the lock is lost: when the
// server says so, or when the lifetime, counted on std::chrono::steady_clock
// from when the last successful renew was sent, has passed.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "queen_locks/errors.hpp"

namespace queen_locks {

namespace detail {
class Route;
}

// Why a held lock was lost.
enum class LostReason {
  renew,    // the server answered a renew: the permit is no longer ours
  guard,    // check() found the permit no longer has our token
  expired,  // the lifetime passed on this machine's clock without a renew getting through
};

// "renew", "guard" or "expired", as the contract spells them.
const char* to_string(LostReason reason) noexcept;

// One held permit, as the route lists it. Times are RFC 3339 strings of the
// server's clock.
struct Holder {
  int slot = 0;
  std::string owner;
  std::uint64_t token = 0;
  std::string since, renewed_at, expires_at;
};

// Guard is the check that fences a write with the current token. A guarded
// Kubernetes object takes it as the annotation
// locks.queen.dev/guard: annotation().
struct Guard {
  std::string op;         // "check"
  std::string ns;         // the key space: "queen-locks"
  std::string namespace_; // the Kubernetes namespace of the permit
  std::string key;        // "<lock>#<slot>"
  std::uint64_t expect = 0;
  bool required = true;

  // "<lock>#<slot>=<token>", the value of locks.queen.dev/guard.
  std::string annotation() const { return key + "=" + std::to_string(expect); }
};

// The label that opts a Kubernetes object in to fencing, and the annotation
// each write to it carries (docs/fencing.md).
inline constexpr const char* kGuardedLabel = "locks.queen.dev/guarded";
inline constexpr const char* kGuardAnnotation = "locks.queen.dev/guard";

// GuardMetadata is what Handle::guard_metadata answers: labels and
// annotations to merge into a Kubernetes object's metadata.
struct GuardMetadata {
  std::map<std::string, std::string> labels;       // locks.queen.dev/guarded: "true"
  std::map<std::string, std::string> annotations;  // locks.queen.dev/guard: "<lock>#<slot>=<token>"

  bool operator==(const GuardMetadata& o) const { return labels == o.labels && annotations == o.annotations; }
};

// Handle is a lock (a semaphore of 1) or one permit of a semaphore. It is
// made by Client::lock or Client::semaphore, is movable and not copyable,
// and releases what it holds when destroyed (never throwing from there).
//
// A handle belongs to one thread at a time; give each thread its own.
class Handle {
 public:
  using Duration = std::chrono::milliseconds;

  Handle(Handle&&) noexcept;
  // Releases what this handle holds (quietly) before taking the other's.
  Handle& operator=(Handle&&) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  // Takes the lock, waiting up to wait (none or zero: one try). Answers
  // false when others held it for the whole wait; reason() and holders()
  // then say more. The route does the waiting and is woken when a slot
  // frees. A call without an answer is asked again within the wait with the
  // same owner; with no wait left it throws Unavailable, and calling again
  // is safe. A no-op answering true while the lock is held.
  bool acquire(std::optional<Duration> wait = std::nullopt);

  // Releases the permit. A no-op when nothing is held (also after a loss).
  // Throws LockLost when the server says it was no longer ours, Unavailable
  // when the route did not answer for a while (the permit then ends with
  // its lifetime).
  void release();

  // The checkpoint: call it often inside the work loop. It renews once a
  // third of the lifetime has passed since the last renew was sent (a renew
  // without an answer is tried again a tenth of the lifetime later, with the
  // same token), and answers whether the lock is still held. False once the
  // server said the permit is gone (lost_reason() renew), or the lifetime
  // passed on the local monotonic clock (expired). Never throws for the
  // route's sake: a route that does not answer only ends in expired. A call
  // may block for one renew, at most until the lifetime ends.
  bool keep_alive();

  // Asks the server whether our token is still the permit's. When it is not,
  // the lock counts as lost with reason guard. False when nothing is held.
  // Throws Unavailable when the route does not answer.
  bool check();

  // Acquires (waiting up to wait), calls fn(*this) (or fn()), and releases
  // after, even when fn throws (fn's exception is then rethrown). Answers
  // false, without calling fn, when the lock could not be had in time. fn
  // should call keep_alive() in its loop and stop when it answers false,
  // and fence what it writes with token().
  template <class F>
  bool run(F&& fn, std::optional<Duration> wait = std::nullopt);

  // What it holds. Read token() when you use it: every renew changes it.
  // held() is false once the lock is lost or released, and once the
  // lifetime has passed on the local clock.
  bool held() const;
  // The fencing token of the last answer (0 before the first acquire).
  std::uint64_t token() const;
  // The permit's slot: 0 for a lock; -1 before the first acquire.
  int slot() const;
  // The guard of the last acquire or renew answer.
  std::optional<Guard> guard() const;
  // The label and annotation that fence a Kubernetes write with the current
  // token; empty while nothing is held. Call it for each write, after the
  // last keep_alive() before it: a renew changes the token.
  std::optional<GuardMetadata> guard_metadata() const;
  // Why the lock was lost, once it was; reset by the next acquire.
  std::optional<LostReason> lost_reason() const;
  // When the server will count the permit expired, by its clock, as of the
  // last answer (RFC 3339); empty before the first acquire.
  std::string expires_at() const;
  // When this handle will count the lock lost without a renew getting
  // through (steady_clock).
  std::chrono::steady_clock::time_point deadline() const;

  // Why the last acquire failed ("held", "contended", "quota"), and who held
  // the lock then.
  std::string reason() const;
  std::vector<Holder> holders() const;

  const std::string& name() const;
  const std::string& owner() const;
  int limit() const;
  Duration ttl() const;

 private:
  friend class Client;
  struct State;
  explicit Handle(std::unique_ptr<State> state);

  State& state();
  const State& state() const;
  // acquire for run: after an acquire that got no answer, release what it
  // may have taken before rethrowing.
  bool acquire_for_run(std::optional<Duration> wait);
  // release for run; quiet when fn threw, so fn's exception is the one seen.
  void release_after_run(bool quiet);
  void lose(LostReason reason);
  std::pair<bool, bool> try_once(int wait_seconds);
  void release_unsure();

  std::unique_ptr<State> s_;
};

template <class F>
bool Handle::run(F&& fn, std::optional<Duration> wait) {
  if (!acquire_for_run(wait)) return false;
  try {
    if constexpr (std::is_invocable_v<F, Handle&>) {
      std::invoke(std::forward<F>(fn), *this);
    } else {
      std::invoke(std::forward<F>(fn));
    }
  } catch (...) {
    release_after_run(true);
    throw;
  }
  release_after_run(false);
  return true;
}

}  // namespace queen_locks
