// The handle against a real route (support.hpp says how to point it at one).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "proxy.hpp"
#include "queen_locks/queen_locks.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using queen_locks::Client;
using queen_locks::Handle;
using queen_locks::LostReason;
using SteadyClock = std::chrono::steady_clock;

// Lets n threads go at once.
class StartLine {
 public:
  explicit StartLine(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

TEST(AcquireRelease, AHeldLockIsRefusedToOthersUntilReleased) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("job");
  Handle a = c.lock(name, 30s), b = c.lock(name, 30s);
  ASSERT_TRUE(a.acquire());
  EXPECT_TRUE(a.held());
  EXPECT_EQ(a.slot(), 0);
  auto holders = c.holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, a.owner());
  EXPECT_EQ(holders[0].token, a.token());
  EXPECT_TRUE(a.acquire()) << "acquire while held is a no-op";
  EXPECT_EQ(holders[0].token, a.token());

  EXPECT_FALSE(b.acquire());
  EXPECT_EQ(b.reason(), "held");
  ASSERT_EQ(b.holders().size(), 1u);
  EXPECT_EQ(b.holders()[0].owner, a.owner());

  a.release();
  EXPECT_FALSE(a.held());
  EXPECT_FALSE(a.lost_reason().has_value()) << "a release is not a loss";
  EXPECT_TRUE(c.holders(name).empty());
  ASSERT_TRUE(b.acquire());
  EXPECT_GT(b.token(), a.token()) << "a later holder's token is higher";
  auto g = b.guard();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->op, "check");
  EXPECT_EQ(g->key, name + "#0");
  EXPECT_EQ(g->expect, b.token());
  EXPECT_TRUE(g->required);
  EXPECT_EQ(g->namespace_, qlt::ns());
  EXPECT_TRUE(b.check());
}

TEST(AcquireRelease, TheDestructorReleasesAndAMoveKeepsThePermit) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("raii");
  std::uint64_t token = 0;
  {
    Handle h = c.lock(name, 30s);
    ASSERT_TRUE(h.acquire());
    token = h.token();
    std::vector<Handle> kept;
    kept.push_back(std::move(h));
    ASSERT_EQ(c.holders(name).size(), 1u) << "moving a handle must not release it";
    EXPECT_EQ(kept[0].token(), token);
    EXPECT_TRUE(kept[0].held());
  }
  EXPECT_TRUE(c.holders(name).empty()) << "the destructor did not release";
}

TEST(AcquireRelease, ExactlyOneOfManyConcurrentThreadsWins) {
  QLT_NEED_ROUTE();
  std::string name = qlt::unique("race");
  constexpr int n = 8;
  // Each thread has its own client and handle, as separate processes would.
  std::vector<Client> clients;
  std::vector<Handle> handles;
  for (int i = 0; i < n; ++i) {
    clients.push_back(qlt::client());
    handles.push_back(clients.back().lock(name, 30s));
  }
  StartLine start(n);
  std::vector<int> won(n, -1);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      try {
        won[i] = handles[i].acquire() ? 1 : 0;
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ASSERT_EQ(std::count(won.begin(), won.end(), 1), 1);
  Handle& winner = handles[std::find(won.begin(), won.end(), 1) - won.begin()];
  auto holders = qlt::client().holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, winner.owner());
  EXPECT_EQ(holders[0].token, winner.token());
  for (int i = 0; i < n; ++i) {
    if (won[i] == 0) {
      EXPECT_TRUE(handles[i].reason() == "held" || handles[i].reason() == "contended") << handles[i].reason();
    }
  }
}

TEST(Semaphore, NHoldersTakeDistinctSlotsAndNoMore) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("pool");
  std::vector<Handle> held;
  std::set<int> slots;
  for (int i = 0; i < 3; ++i) {
    held.push_back(c.semaphore(name, 3, 30s));
    ASSERT_TRUE(held.back().acquire());
    slots.insert(held.back().slot());
  }
  EXPECT_EQ(slots, (std::set<int>{0, 1, 2}));
  Handle fourth = c.semaphore(name, 3, 30s);
  EXPECT_FALSE(fourth.acquire());
  EXPECT_EQ(fourth.reason(), "held");
  EXPECT_EQ(fourth.holders().size(), 3u);
}

TEST(Semaphore, ConcurrentHoldersNeverExceedN) {
  QLT_NEED_ROUTE();
  std::string name = qlt::unique("never-over");
  constexpr int n = 3, threads_n = 8, rounds = 3;
  std::mutex mu;
  int inside = 0, most = 0, ran = 0;
  std::set<int> in_use;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  StartLine start(threads_n);
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&] {
      Client c = qlt::client();
      start.arrive_and_wait();
      try {
        for (int r = 0; r < rounds; ++r) {
          Handle h = c.semaphore(name, n, 30s);
          bool got = h.run(
              [&](Handle& held) {
                {
                  std::lock_guard<std::mutex> lock(mu);
                  if (!in_use.insert(held.slot()).second) errors.push_back("slot " + std::to_string(held.slot()) + " given twice");
                  most = std::max(most, ++inside);
                  ++ran;
                }
                // Hold it a moment (the work), so holders overlap.
                std::this_thread::sleep_for(50ms);
                std::lock_guard<std::mutex> lock(mu);
                --inside;
                in_use.erase(held.slot());
              },
              60s);
          if (!got) {
            std::lock_guard<std::mutex> lock(mu);
            errors.push_back("not acquired within 60s: " + h.reason());
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(ran, threads_n * rounds);
  EXPECT_LE(most, n);
  EXPECT_GE(most, 2) << "holders never overlapped: the test proved nothing";
  EXPECT_TRUE(qlt::client().holders(name).empty());
}

TEST(Retry, ALostAnswerIsAskedAgainWithTheSameOwner) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("retried");
  qlt::Proxy proxy(qlt::url());
  Handle h = qlt::client(proxy.url()).lock(name, 3s);
  proxy.drop = 1;  // the acquire lands, its answer does not come back
  ASSERT_TRUE(h.acquire(10s));
  EXPECT_GE(proxy.calls.load(), 2);
  auto holders = c.holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, h.owner());
  EXPECT_EQ(holders[0].token, h.token());

  // A renew whose answer is lost: the next one sends the same (now stale)
  // token, and the route carries it through to the current one.
  std::uint64_t before = h.token();
  int calls = proxy.calls.load();
  proxy.drop = 1;
  std::set<std::uint64_t> tokens;
  ASSERT_TRUE(qlt::wait_for("two renewals after a lost answer", [&] {
    if (!h.keep_alive()) throw std::runtime_error("lost: " + std::string(to_string(*h.lost_reason())));
    if (h.token() != before) tokens.insert(h.token());
    return tokens.size() >= 2;
  }));
  EXPECT_GE(proxy.calls.load(), calls + 3) << "the dropped renew, its retry and one more";
  holders = c.holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, h.owner());
  EXPECT_EQ(holders[0].token, h.token());
}

TEST(Retry, ReleaseAfterAnUnansweredAcquireFreesWhatItTook) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("unsure");
  qlt::Proxy proxy(qlt::url());
  Handle h = qlt::client(proxy.url()).lock(name, 30s);
  proxy.drop = 1;
  EXPECT_THROW(h.acquire(), queen_locks::Unavailable);
  auto holders = c.holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, h.owner());
  EXPECT_FALSE(h.held());
  h.release();
  EXPECT_TRUE(c.holders(name).empty()) << "the permit the lost answer told of is still held";
}

TEST(Loss, DeletingThePermitByHandIsLearntAtTheNextRenewWithReasonRenew) {
  QLT_NEED_KUBECTL();
  std::string name = qlt::unique("deleted");
  const auto ttl = 6s;
  Handle h = qlt::client().lock(name, ttl);
  auto asked = SteadyClock::now();
  ASSERT_TRUE(h.acquire());
  qlt::delete_permit(name);
  auto deleted = SteadyClock::now();
  // The work loop: the checkpoint learns nothing until a renew is due.
  while (h.keep_alive()) {
    ASSERT_LT(qlt::ms(SteadyClock::now() - deleted), qlt::ms(ttl)) << "the loss was never learnt";
    std::this_thread::sleep_for(20ms);  // the work between checkpoints
  }
  auto learnt = SteadyClock::now();
  ASSERT_TRUE(h.lost_reason().has_value());
  EXPECT_EQ(*h.lost_reason(), LostReason::renew);
  EXPECT_GE(qlt::ms(learnt - asked), qlt::ms(ttl / 3)) << "it renewed before a third of the lifetime had passed";
  // The first renew due after the delete learns it: the one a third of the
  // lifetime after the acquire was sent, or at once when kubectl took longer
  // (with slack for a call on a busy machine).
  EXPECT_LT(qlt::ms(learnt - std::max(asked + ttl / 3, deleted)), 2000);
  EXPECT_FALSE(h.held());
  EXPECT_FALSE(h.keep_alive()) << "once lost, it stays lost";
  h.release();  // nothing held: a no-op
}

TEST(Loss, ARouteThatStopsAnsweringIsGivenUpOnTheLocalClock) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("cut-off");
  const auto ttl = 2s;
  // Requests reach the route 300 ms after they are sent, so the server's
  // lifetime starts later than the one the handle counts.
  qlt::Proxy proxy(qlt::url(), 300ms);
  Handle h = qlt::client(proxy.url()).lock(name, ttl);
  auto acquired_at = std::chrono::system_clock::now();
  ASSERT_TRUE(h.acquire());
  std::uint64_t first = h.token();
  ASSERT_TRUE(qlt::wait_for("a renew to get through", [&] { return h.keep_alive() && h.token() != first; }));
  proxy.cut();
  auto server_expiry = qlt::parse_time(h.expires_at());  // of the last renew that got through
  std::chrono::system_clock::time_point lost_at;
  ASSERT_TRUE(qlt::wait_for("the handle to give up", [&] {
    if (h.keep_alive()) return false;
    lost_at = std::chrono::system_clock::now();
    return true;
  }));
  ASSERT_TRUE(h.lost_reason().has_value());
  EXPECT_EQ(*h.lost_reason(), LostReason::expired);
  EXPECT_LT(qlt::ms(lost_at - server_expiry), 0) << "the handle must give up before the server does";
  EXPECT_GE(qlt::ms(lost_at - acquired_at), qlt::ms(ttl)) << "a renew got through: it cannot have expired within one lifetime";
  EXPECT_FALSE(h.held());
  auto holders = c.holders(name);
  if (!holders.empty()) {
    EXPECT_EQ(holders[0].owner, h.owner()) << "nobody else may have it before the server's expiry";
  }
}

TEST(Run, WaitsForTheHolderAndGivesUpWhenTheWaitEnds) {
  QLT_NEED_ROUTE();
  Client c = qlt::client();
  std::string name = qlt::unique("turn");
  Handle holder = c.lock(name, 30s);
  ASSERT_TRUE(holder.acquire());

  bool ran = false;
  auto t0 = SteadyClock::now();
  EXPECT_FALSE(c.lock(name, 30s).run([&] { ran = true; }, 300ms));
  EXPECT_FALSE(ran);
  EXPECT_GE(qlt::ms(SteadyClock::now() - t0), 300) << "it did not wait";

  qlt::Proxy proxy(qlt::url());
  Handle waiter = qlt::client(proxy.url()).lock(name, 30s);
  struct Seen {
    bool held = false;
    std::uint64_t token = 0;
    bool keep_alive = false;
  } seen;
  std::string error;
  bool returned = false;
  std::thread t([&] {
    try {
      returned = waiter.run(
          [&](Handle& h) {
            seen = {h.held(), h.token(), h.keep_alive()};
            throw std::runtime_error("the job's own error");
          },
          20s);
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  });
  // The waiter is waiting at the route (one call, woken by the server).
  qlt::wait_for("the waiter to ask", [&] { return proxy.calls.load() >= 1; });
  holder.release();
  t.join();
  EXPECT_FALSE(returned);
  EXPECT_EQ(error, "the job's own error");
  EXPECT_TRUE(seen.held);
  EXPECT_TRUE(seen.keep_alive);
  EXPECT_GT(seen.token, holder.token());
  EXPECT_FALSE(waiter.held());
  EXPECT_TRUE(c.holders(name).empty()) << "run releases even when the job fails";

  // And a run that gets the lock at once answers true.
  int runs = 0;
  EXPECT_TRUE(c.lock(name, 30s).run([&](Handle& h) { runs += h.held() ? 1 : 100; }));
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(c.holders(name).empty());
}

TEST(Guard, IsAcceptedByAGuardedWriteAndRefusedAfterLoss) {
  QLT_NEED_KUBECTL();
  std::string name = qlt::unique("fenced"), cm = qlt::unique("report");
  Handle h = qlt::client().lock(name, 60s);
  ASSERT_TRUE(h.acquire());
  auto g = h.guard();
  ASSERT_TRUE(g.has_value());
  std::string guard = g->annotation();
  EXPECT_EQ(guard, name + "#0=" + std::to_string(h.token()));
  auto r = qlt::write_configmap(cm, guard, "first", true);
  ASSERT_EQ(r.code, 0) << r.err;
  r = qlt::write_configmap(cm, guard, "second", false);
  ASSERT_EQ(r.code, 0) << r.err;

  qlt::delete_permit(name);
  EXPECT_FALSE(h.check());
  ASSERT_TRUE(h.lost_reason().has_value());
  EXPECT_EQ(*h.lost_reason(), LostReason::guard);
  EXPECT_FALSE(h.keep_alive());

  r = qlt::write_configmap(cm, guard, "stale", false);
  EXPECT_NE(r.code, 0) << "a write under a lost lock's token was admitted";
  EXPECT_NE(r.err.find("kv_precondition"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
}

// A ConfigMap with guard_metadata's labels and annotations, written with kubectl.
static qlt::Ran write_configmap_with(const std::string& name, const queen_locks::GuardMetadata& m, const std::string& value,
                                     bool create) {
  auto object = [](const std::map<std::string, std::string>& kv) {
    std::string out = "{";
    for (const auto& [k, v] : kv) out += (out.size() > 1 ? ",\"" : "\"") + k + "\":\"" + v + "\"";
    return out + "}";
  };
  std::string cm = R"({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":")" + name + R"(","labels":)" +
                   object(m.labels) + R"(,"annotations":)" + object(m.annotations) + R"(},"data":{"report":")" + value +
                   R"("}})";
  return qlt::kubectl({create ? "create" : "replace", "-f", "-"}, cm);
}

TEST(Guard, GuardMetadataFencesAWriteUntilTheLockIsTakenOver) {
  QLT_NEED_KUBECTL();
  std::string name = qlt::unique("fenced"), cm = qlt::unique("report");
  queen_locks::Client c = qlt::client();
  Handle h = c.lock(name, 60s);
  EXPECT_FALSE(h.guard_metadata().has_value()) << "a guard before any acquire";
  ASSERT_TRUE(h.acquire());
  queen_locks::GuardMetadata want;
  want.labels[queen_locks::kGuardedLabel] = "true";
  want.annotations[queen_locks::kGuardAnnotation] = name + "#0=" + std::to_string(h.token());
  ASSERT_TRUE(h.guard_metadata().has_value());
  EXPECT_TRUE(*h.guard_metadata() == want);
  auto r = write_configmap_with(cm, *h.guard_metadata(), "first", true);
  ASSERT_EQ(r.code, 0) << r.err;
  r = write_configmap_with(cm, *h.guard_metadata(), "second", false);
  ASSERT_EQ(r.code, 0) << r.err;

  // Taken over: the permit deleted by hand and acquired by another.
  qlt::delete_permit(name);
  Handle b = c.lock(name, 60s);
  ASSERT_TRUE(qlt::wait_for("the other holder to acquire", [&] { return b.acquire(); }));
  r = write_configmap_with(cm, *h.guard_metadata(), "stale", false);
  EXPECT_NE(r.code, 0) << "a replaced holder's write was admitted";
  EXPECT_NE(r.err.find("kv_precondition"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
  EXPECT_FALSE(h.check());
  ASSERT_TRUE(h.lost_reason().has_value());
  EXPECT_EQ(*h.lost_reason(), LostReason::guard);
  EXPECT_FALSE(h.guard_metadata().has_value()) << "a guard after the loss";
}

TEST(TLS, AnHttpsRouteIsVerifiedWithTheCAFile) {
  QLT_NEED_ROUTE();
  if (qlt::tls_dir().empty()) GTEST_SKIP() << "QUEEN_LOCKS_TEST_TLS_DIR is not set (go test ./clients/ makes it)";
  qlt::Proxy::Tls cert{qlt::tls_dir() + "/tls.crt", qlt::tls_dir() + "/tls.key"};
  qlt::Proxy proxy(qlt::url(), 0ms, &cert);
  ASSERT_EQ(proxy.url().rfind("https://", 0), 0u);
  std::string name = qlt::unique("tls");
  queen_locks::Options o;
  o.url = proxy.url();
  o.namespace_ = qlt::ns();
  o.ca_file = qlt::tls_dir() + "/ca.crt";
  {
    Handle h = Client(o).lock(name, 30s);
    ASSERT_TRUE(h.acquire());
    auto holders = qlt::client().holders(name);
    ASSERT_EQ(holders.size(), 1u);
    EXPECT_EQ(holders[0].owner, h.owner());
    h.release();
  }
  // Without the CA the route is not trusted: a clear error at once, not an
  // unanswered call to ask again.
  o.ca_file = "";
  Handle stranger = Client(o).lock(name, 30s);
  auto t0 = SteadyClock::now();
  try {
    stranger.acquire(30s);
    FAIL() << "acquired over an untrusted route";
  } catch (const queen_locks::Unavailable& e) {
    FAIL() << "an untrusted certificate is not a route without an answer: " << e.what();
  } catch (const queen_locks::Error& e) {
    EXPECT_NE(std::string(e.what()).find("certificate"), std::string::npos) << e.what();
  }
  EXPECT_LT(qlt::ms(SteadyClock::now() - t0), 10000) << "it asked again instead of failing at once";
  EXPECT_TRUE(qlt::client().holders(name).empty());
}

}  // namespace
