// The checkpoint: keep_alive() renews only once a third of the lifetime has
// passed since the last renew was sent, and keeps a lock for as long as the
// work loop calls it.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "queen_locks/queen_locks.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using queen_locks::Handle;
using SteadyClock = std::chrono::steady_clock;

TEST(KeepAlive, KeepsALockForSeveralLifetimesWithTheTokenChanging) {
  QLT_NEED_ROUTE();
  auto c = qlt::client();
  std::string name = qlt::unique("long-job");
  const auto ttl = 2s;
  Handle h = c.lock(name, ttl);
  auto start = SteadyClock::now();
  ASSERT_TRUE(h.acquire());
  std::vector<std::uint64_t> tokens{h.token()};
  // The work loop: a piece of work, then the checkpoint. Seven renewals a
  // third of a lifetime apart outlive the lifetime twice over.
  while (tokens.size() < 8) {
    ASSERT_LT(qlt::ms(SteadyClock::now() - start), 30000) << "renewals: " << tokens.size() - 1;
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(h.keep_alive()) << "lost: " << queen_locks::to_string(*h.lost_reason());
    if (h.token() != tokens.back()) tokens.push_back(h.token());
  }
  EXPECT_GE(qlt::ms(SteadyClock::now() - start), qlt::ms(2 * ttl)) << "seven renewals came faster than a third of the lifetime apart";
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]) << "every renew answers a higher token";
  EXPECT_TRUE(h.held());
  EXPECT_FALSE(h.lost_reason().has_value());
  auto holders = c.holders(name);
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].owner, h.owner());
  EXPECT_EQ(holders[0].token, h.token());
  ASSERT_TRUE(h.guard().has_value());
  EXPECT_EQ(h.guard()->expect, h.token()) << "the guard follows the token";
  h.release();
  EXPECT_TRUE(c.holders(name).empty());
}

// Counts API writes with kube-apiserver's own metrics: the route renews with
// one update of the permit (locks.Client.Renew, stamped by the manager), and
// nothing else updates queenlocks while this test runs (the handles of the other tests in
// this process have no background threads, and ctest runs one test at a
// time).
TEST(KeepAlive, DoesNotRenewBeforeAThirdOfTheLifetimeThenRenewsOnce) {
  QLT_NEED_KUBECTL();
  auto c = qlt::client();
  std::string name = qlt::unique("checkpoint");
  // A third is 5 s: room for kubectl's metrics call, then a loop of
  // checkpoints.
  const auto ttl = 15s;
  Handle h = c.lock(name, ttl);
  auto asked = SteadyClock::now();  // the acquire is sent after this
  ASSERT_TRUE(h.acquire());
  const std::uint64_t token = h.token();
  const long long before = qlt::renew_writes();
  ASSERT_GE(before, 0);

  // A tight loop of checkpoints for less than a third of the lifetime since
  // the acquire was sent: no request at all.
  long long checkpoints = 0;
  while (SteadyClock::now() < asked + ttl / 3 - 100ms) {
    ASSERT_TRUE(h.keep_alive());
    ++checkpoints;
  }
  EXPECT_GT(checkpoints, 1000) << "the loop hardly ran: kubectl took most of the third";
  EXPECT_EQ(h.token(), token) << "a renew was sent before a third of the lifetime";
  const long long during = qlt::renew_writes();
  EXPECT_EQ(during, before) << checkpoints << " checkpoints wrote to the API";

  // Past the third: the next checkpoint renews, once.
  while (h.token() == token) {
    ASSERT_LT(qlt::ms(SteadyClock::now() - asked), qlt::ms(ttl)) << "no renew came";
    ASSERT_TRUE(h.keep_alive());
  }
  const std::uint64_t renewed = h.token();
  auto renewed_at = SteadyClock::now();
  // And the checkpoints right after it send nothing again.
  while (SteadyClock::now() < renewed_at + 500ms) ASSERT_TRUE(h.keep_alive());
  EXPECT_EQ(h.token(), renewed);
  const long long after = qlt::renew_writes();
  EXPECT_EQ(after - during, 1) << "one renew, one API write";
  h.release();
}

}  // namespace
