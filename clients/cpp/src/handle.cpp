// The handle's life: acquire, the keep_alive checkpoint, check, release.
#include "queen_locks/handle.hpp"

#include <algorithm>
#include <iostream>
#include <random>
#include <thread>

#include "queen_locks/client.hpp"
#include "route.hpp"
#include "validate.hpp"

namespace queen_locks {

using Clock = std::chrono::steady_clock;
using detail::json;
using detail::Millis;

namespace {

// Polling between tries when the route cannot wait for us: 100 ms doubling
// to 1 s.
constexpr Millis kPollFirst{100}, kPollMax{1000};
// A release without an answer is tried again for at most this long.
constexpr Millis kReleaseRetry{10000};
// How often acquire asks again when a permit the route says is already ours
// is lost before it could be renewed.
constexpr int kAlreadyTries = 3;

// Rounded up: a wait with 0.7 ms left is not over (truncated, it would
// read 0 and the handle would give up before its deadline).
Millis left_until(Clock::time_point t) { return std::chrono::ceil<Millis>(t - Clock::now()); }

// A pause of about poll, never past left: jitter spreads waiters out, so
// they do not all ask at once.
void pause(Millis poll, Millis left) {
  thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<long long> d(0, poll.count());
  std::this_thread::sleep_for(std::min(Millis(poll.count() / 2 + d(rng)), left));
}

}  // namespace

const char* to_string(LostReason reason) noexcept {
  switch (reason) {
    case LostReason::renew:
      return "renew";
    case LostReason::guard:
      return "guard";
    case LostReason::expired:
      return "expired";
  }
  return "unknown";
}

struct Handle::State {
  std::shared_ptr<detail::Route> route;
  std::string name, owner;
  int limit = 1;
  Millis ttl{};
  std::int64_t ttl_seconds = 0;

  // The lease: what the server last answered about our permit.
  bool held = false;
  int slot = -1;
  std::uint64_t token = 0;
  // When we must count the lease over: the send time of the last renew
  // (or acquire) that got through, plus the lifetime.
  Clock::time_point deadline{};
  // When keep_alive next sends a renew.
  Clock::time_point renew_at{};
  std::optional<Guard> guard;
  std::string expires_at;
  std::optional<LostReason> lost;

  // An acquire or release got no answer: the route may hold a permit of ours.
  bool unsure = false;
  // Why the last acquire failed, and who held the lock then.
  std::string reason;
  std::vector<Holder> holders;

  // Records a won permit; its lifetime counts from sent.
  void start(int s, std::uint64_t t, Clock::time_point sent, const json& answer) {
    held = true;
    slot = s;
    token = t;
    deadline = sent + ttl;
    renew_at = sent + ttl / 3;
    guard = detail::guard_of(answer);
    expires_at = answer.value("expiresAt", std::string());
    lost.reset();
    reason.clear();
    holders.clear();
    unsure = false;
  }
};

Handle Client::semaphore(std::string name, int n, std::chrono::milliseconds ttl, std::string owner) const {
  detail::validate_name(name);
  detail::validate_limit(n);
  auto ttl_seconds = detail::validate_ttl(ttl);
  detail::validate_owner(owner);
  auto s = std::make_unique<Handle::State>();
  s->route = route_;
  s->name = std::move(name);
  s->owner = std::move(owner);
  s->limit = n;
  // The server counts whole seconds, rounded up; our own deadline uses the
  // exact ttl, which is never later.
  s->ttl = ttl;
  s->ttl_seconds = ttl_seconds;
  return Handle(std::move(s));
}

Handle::Handle(std::unique_ptr<State> state) : s_(std::move(state)) {}
Handle::Handle(Handle&&) noexcept = default;

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    try {
      if (s_) release();
    } catch (...) {
      // Moving must not throw: the permit ends with its lifetime.
    }
    s_ = std::move(other.s_);
  }
  return *this;
}

Handle::~Handle() {
  if (!s_) return;
  try {
    release();
  } catch (const std::exception& e) {
    // A destructor must not throw; the permit ends with its lifetime.
    std::cerr << "queen_locks: releasing \"" << s_->name << "\": " << e.what() << "\n";
  } catch (...) {
  }
}

Handle::State& Handle::state() {
  if (!s_) throw Error("queen_locks: use of a moved-from Handle");
  return *s_;
}

const Handle::State& Handle::state() const {
  if (!s_) throw Error("queen_locks: use of a moved-from Handle");
  return *s_;
}

// Acquire.

bool Handle::acquire(std::optional<Duration> wait) {
  State& s = state();
  Millis w = wait.value_or(Millis::zero());
  detail::validate_wait(w);
  if (s.held) {
    if (Clock::now() < s.deadline) return true;
    lose(LostReason::expired);
  }
  const auto give_up = Clock::now() + w;
  Millis poll = kPollFirst;
  for (;;) {
    // How long this call may wait at the route: whole seconds, at most 60,
    // and at most a third of the lifetime, so the lifetime counted from when
    // the call was sent still has two thirds left when the answer comes.
    int wait_seconds = 0;
    if (s.route->takes_wait()) {
      auto left_s = std::chrono::duration_cast<std::chrono::seconds>(left_until(give_up)).count();
      auto third_s = std::chrono::duration_cast<std::chrono::seconds>(s.ttl / 3).count();
      wait_seconds = static_cast<int>(std::max<long long>(0, std::min<long long>({detail::kMaxWaitSeconds, left_s, third_s})));
    }
    std::exception_ptr failure;
    bool waited = false;
    try {
      auto [won, w2] = try_once(wait_seconds);
      if (won) return true;
      waited = w2;
    } catch (const Unavailable&) {
      failure = std::current_exception();
    }
    Millis left = left_until(give_up);
    if (left <= Millis::zero()) {
      if (failure) std::rethrow_exception(failure);
      return false;
    }
    if (waited) {
      // The route waited for us and no slot freed (or it was taken first):
      // ask again at once.
      poll = kPollFirst;
      continue;
    }
    pause(poll, left);
    poll = std::min(poll * 2, kPollMax);
  }
}

std::pair<bool, bool> Handle::try_once(int wait_seconds) {
  State& s = state();
  for (int i = 0; i < kAlreadyTries; ++i) {
    auto sent = Clock::now();
    json r;
    int asked = 0;
    try {
      std::tie(r, asked) = s.route->acquire(s.name, s.owner, s.ttl_seconds, s.limit, wait_seconds);
    } catch (const Unavailable&) {
      s.unsure = true;
      throw;
    }
    auto took = Clock::now() - sent;
    if (!r.value("acquired", false)) {
      // The route answers already, not held, to an owner holding a permit:
      // we hold none.
      s.reason = r.value("reason", std::string());
      s.holders = detail::holders_of(r);
      s.unsure = false;
      return {false, asked > 0 && took >= std::chrono::seconds(asked)};
    }
    int slot = r.value("slot", 0);
    auto token = r.value("token", std::uint64_t{0});
    if (!r.value("already", false)) {
      s.start(slot, token, sent, r);
      return {true, false};
    }
    // The permit was already ours: an earlier acquire whose answer was lost,
    // or a release that did not get through. Its lifetime was counted from a
    // write we never saw, and expiresAt is the server's wall clock, which
    // ours cannot be compared with. So renew it at once and count from when
    // that renew was sent.
    sent = Clock::now();
    json rn;
    try {
      rn = s.route->renew(s.name, slot, token, s.owner, s.ttl_seconds, detail::kCallTimeout);
    } catch (const Unavailable&) {
      s.unsure = true;
      throw;
    }
    if (rn.value("renewed", false)) {
      s.start(slot, rn.value("token", token), sent, rn);
      return {true, false};
    }
    // It expired or was deleted between the two answers: ask again.
  }
  throw Error("acquiring \"" + s.name + "\": a permit the route said was ours was lost " +
              std::to_string(kAlreadyTries) + " times before it could be renewed");
}

// The checkpoint.

bool Handle::keep_alive() {
  State& s = state();
  if (!s.held) return false;
  const auto sent = Clock::now();
  if (sent >= s.deadline) {
    lose(LostReason::expired);
    return false;
  }
  if (sent < s.renew_at) return true;  // the common case: no request at all
  json r;
  try {
    // Never past our deadline: an answer after it would not count anyway.
    auto timeout = std::min(detail::kCallTimeout, std::chrono::duration_cast<Millis>(s.deadline - sent));
    // Always the token of the last answer: a renew whose answer was lost
    // is carried through by the route when we send its token again.
    r = s.route->renew(s.name, s.slot, s.token, s.owner, s.ttl_seconds, timeout);
  } catch (const Error&) {
    // No answer, or one we cannot act on (a token file being rotated, say):
    // try again soon, with the same token, until the deadline.
    auto now = Clock::now();
    if (now >= s.deadline) {
      lose(LostReason::expired);
      return false;
    }
    s.renew_at = std::min(s.deadline, now + std::max<Millis>(s.ttl / 10, Millis(100)));
    return true;
  }
  if (!r.value("renewed", false)) {
    lose(LostReason::renew);
    return false;
  }
  if (Clock::now() >= s.deadline) {
    // It landed, but we learnt it only after our deadline: by then we had
    // to count the lease over, and we keep to that.
    lose(LostReason::expired);
    return false;
  }
  auto token = r.value("token", std::uint64_t{0});
  if (token >= s.token) {
    s.token = token;
    if (auto g = detail::guard_of(r)) s.guard = g;
    s.expires_at = r.value("expiresAt", s.expires_at);
  }
  s.deadline = std::max(s.deadline, sent + s.ttl);
  s.renew_at = sent + s.ttl / 3;
  return true;
}

bool Handle::check() {
  State& s = state();
  if (!s.held) return false;
  if (Clock::now() >= s.deadline) {
    lose(LostReason::expired);
    return false;
  }
  if (s.route->check(s.name, s.slot, s.token).value("ok", false)) return true;
  lose(LostReason::guard);
  return false;
}

void Handle::lose(LostReason reason) {
  State& s = state();
  if (!s.held) return;
  s.held = false;
  s.lost = reason;
}

// Release.

void Handle::release() {
  State& s = state();
  if (!s.held) {
    if (s.unsure) release_unsure();
    return;
  }
  if (Clock::now() >= s.deadline) {
    // Past our deadline the lease counts as over (lost, not released).
    lose(LostReason::expired);
    return;
  }
  s.held = false;
  const auto give_up = std::min(s.deadline, Clock::now() + kReleaseRetry);
  Millis poll = kPollFirst;
  bool unanswered = false;
  json r;
  for (;;) {
    try {
      auto timeout = std::clamp(left_until(give_up), Millis(100), detail::kCallTimeout);
      r = s.route->release(s.name, s.slot, s.token, s.owner, timeout);
      break;
    } catch (const Unavailable&) {
      Millis left = left_until(give_up);
      if (left <= Millis::zero()) {
        s.unsure = true;
        throw;
      }
      unanswered = true;
      pause(poll, left);
      poll = std::min(poll * 2, kPollMax);
    }
  }
  // After a release whose answer was lost, "lost" may mean that one landed.
  if (!r.value("released", false) && !unanswered) throw LockLost(s.name, r.value("reason", std::string("lost")));
}

void Handle::release_unsure() {
  // An unanswered call may have left a permit of our owner: we never learnt
  // its slot and token, so ask the route.
  State& s = state();
  for (const Holder& h : detail::holders_of(s.route->get(s.name))) {
    // Not ours any more is as good as released here.
    if (h.owner == s.owner) s.route->release(s.name, h.slot, h.token, s.owner, detail::kCallTimeout);
  }
  s.unsure = false;
}

// run's helpers.

bool Handle::acquire_for_run(std::optional<Duration> wait) {
  try {
    return acquire(wait);
  } catch (const Unavailable&) {
    try {
      release();
    } catch (const Error&) {
      // The acquire's own failure is the one to report.
    }
    throw;
  }
}

void Handle::release_after_run(bool quiet) {
  try {
    release();
  } catch (const LockLost&) {
    // The work has ended; keep_alive already answered false for it.
  } catch (const Error&) {
    if (!quiet) throw;
  }
}

// Accessors.

bool Handle::held() const {
  // Past the deadline the lease is over, even before keep_alive says so.
  const State& s = state();
  return s.held && Clock::now() < s.deadline;
}
std::uint64_t Handle::token() const { return state().token; }
int Handle::slot() const { return state().slot; }
std::optional<Guard> Handle::guard() const { return state().guard; }

std::optional<GuardMetadata> Handle::guard_metadata() const {
  if (!held()) return std::nullopt;
  GuardMetadata m;
  m.labels[kGuardedLabel] = "true";
  m.annotations[kGuardAnnotation] = name() + "#" + std::to_string(slot()) + "=" + std::to_string(token());
  return m;
}
std::optional<LostReason> Handle::lost_reason() const { return state().lost; }
std::string Handle::expires_at() const { return state().expires_at; }
std::chrono::steady_clock::time_point Handle::deadline() const { return state().deadline; }
std::string Handle::reason() const { return state().reason; }
std::vector<Holder> Handle::holders() const { return state().holders; }
const std::string& Handle::name() const { return state().name; }
const std::string& Handle::owner() const { return state().owner; }
int Handle::limit() const { return state().limit; }
Handle::Duration Handle::ttl() const { return state().ttl; }

}  // namespace queen_locks
