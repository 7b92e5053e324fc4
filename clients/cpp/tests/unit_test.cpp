// The handle without a route: bad input is refused before any request,
// naming the field; a route that does not answer is Unavailable.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>
#include <type_traits>

#include "proxy.hpp"
#include "queen_locks/queen_locks.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using queen_locks::Client;
using queen_locks::Handle;
using queen_locks::InvalidArgument;

static_assert(std::is_move_constructible_v<Handle> && std::is_move_assignable_v<Handle>);
static_assert(!std::is_copy_constructible_v<Handle> && !std::is_copy_assignable_v<Handle>);
static_assert(std::is_nothrow_destructible_v<Handle>);

// The field an InvalidArgument names, or "(nothing thrown)".
template <class F>
std::string refused_field(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(e.field()), std::string::npos) << e.what();
    return e.field();
  }
  return "(nothing thrown)";
}

// A route that never answers: a proxy to a port nothing listens on. It
// counts the calls that reach it.
struct Nowhere {
  qlt::Proxy proxy{"http://127.0.0.1:1"};
  Client client() const {
    queen_locks::Options o;
    o.url = proxy.url();
    return Client(o);
  }
};

// A fake route on loopback that records each request and answers every call
// with one canned result.
class FakeRoute {
 public:
  explicit FakeRoute(std::string result) : result_(std::move(result)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 8);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    url_ = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRoute() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  const std::string& url() const { return url_; }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    for (int c; (c = accept(fd_, nullptr, nullptr)) >= 0; close(c)) {
      std::string req;
      char buf[4096];
      // Headers, then as much body as Content-Length says.
      for (ssize_t n; (n = recv(c, buf, sizeof buf, 0)) > 0;) {
        req.append(buf, static_cast<size_t>(n));
        auto end = req.find("\r\n\r\n");
        auto cl = req.find("Content-Length: ");
        if (end != std::string::npos && cl != std::string::npos &&
            req.size() >= end + 4 + std::stoul(req.substr(cl + 16)))
          break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req);
      }
      std::string body = R"({"results":[)" + result_ + "]}";
      std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
      send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
    }
  }

  std::string result_, url_;
  int fd_ = -1;
  std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

TEST(Route, SendsTheBearerTokenReadAgainWhenItsFileChanges) {
  FakeRoute route(R"({"index":0,"op":"get","name":"x","holders":[]})");
  std::string dir = qlt::env("TMPDIR").empty() ? "/tmp" : qlt::env("TMPDIR");
  std::string file = dir + "/queen-locks-cpp-token-" + std::to_string(getpid());
  std::ofstream(file) << "first-token\n";
  ASSERT_EQ(setenv("QUEEN_LOCKS_TOKEN_FILE", file.c_str(), 1), 0);
  queen_locks::Options o;
  o.url = route.url();
  o.namespace_ = "team-a";
  Client c(o);
  EXPECT_TRUE(c.holders("x").empty());
  // The kubelet swaps the file for a new one.
  std::string next = file + ".new";
  std::ofstream(next) << "second-token";
  ASSERT_EQ(rename(next.c_str(), file.c_str()), 0);
  EXPECT_TRUE(c.holders("x").empty());
  unlink(file.c_str());
  // An option set to "" means no token, whatever the environment says.
  o.token_file = "";
  EXPECT_TRUE(Client(o).holders("x").empty());

  auto reqs = route.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].rfind("POST /api/v1/locks HTTP/1.1\r\n", 0), 0u) << reqs[0];
  EXPECT_NE(reqs[0].find("\r\nAuthorization: Bearer first-token\r\n"), std::string::npos) << reqs[0];
  EXPECT_NE(reqs[0].find(R"({"namespace":"team-a","operations":[{"name":"x","op":"get"}]})"), std::string::npos) << reqs[0];
  EXPECT_NE(reqs[1].find("\r\nAuthorization: Bearer second-token\r\n"), std::string::npos) << reqs[1];
  EXPECT_EQ(reqs[2].find("Authorization"), std::string::npos) << reqs[2];
  ASSERT_EQ(unsetenv("QUEEN_LOCKS_TOKEN_FILE"), 0);
}

TEST(Input, BadArgumentsAreRefusedBeforeAnyRequestNamingTheField) {
  Nowhere nowhere;
  Client c = nowhere.client();
  EXPECT_EQ(refused_field([&] { c.lock("", 30s); }), "name");
  EXPECT_EQ(refused_field([&] { c.lock("a#b", 30s); }), "name");
  EXPECT_EQ(refused_field([&] { c.lock("tab\there", 30s); }), "name");
  EXPECT_EQ(refused_field([&] { c.lock("bad\xff utf8", 30s); }), "name");
  EXPECT_EQ(refused_field([&] { c.lock(std::string(257, 'x'), 30s); }), "name");
  EXPECT_EQ(refused_field([&] { c.lock("ok", 999ms); }), "ttl");
  EXPECT_EQ(refused_field([&] { c.lock("ok", 0s); }), "ttl");
  EXPECT_EQ(refused_field([&] { c.lock("ok", -5s); }), "ttl");
  EXPECT_EQ(refused_field([&] { c.lock("ok", std::chrono::hours(24 * 366)); }), "ttl");
  EXPECT_EQ(refused_field([&] { c.semaphore("ok", 0, 30s); }), "n");
  EXPECT_EQ(refused_field([&] { c.semaphore("ok", -1, 30s); }), "n");
  EXPECT_EQ(refused_field([&] { c.semaphore("ok", 1025, 30s); }), "n");
  EXPECT_EQ(refused_field([&] { c.semaphore("ok", 2, 30s, ""); }), "owner");
  EXPECT_EQ(refused_field([&] { c.holders(""); }), "name");
  Handle h = c.lock("ok", 30s);
  EXPECT_EQ(refused_field([&] { h.acquire(-1ms); }), "wait");
  EXPECT_EQ(refused_field([&] { h.run([] {}, -1s); }), "wait");
  // Fine names: 256 bytes, and any UTF-8.
  EXPECT_EQ(refused_field([&] { c.lock(std::string(256, 'x'), 1s); }), "(nothing thrown)");
  EXPECT_EQ(refused_field([&] { c.semaphore("nächtlicher bericht ✓", 1024, 1s); }), "(nothing thrown)");
  EXPECT_EQ(nowhere.proxy.calls.load(), 0) << "a request was sent for bad input";
}

TEST(Input, TheRouteURLAndCAFileAreChecked) {
  ASSERT_EQ(setenv("QUEEN_LOCKS_URL", "", 1), 0);
  EXPECT_EQ(refused_field([] { Client c; }), "url");
  queen_locks::Options o;
  o.url = "ftp://example";
  EXPECT_EQ(refused_field([&] { Client c(o); }), "url");
  o.url = "http://";
  EXPECT_EQ(refused_field([&] { Client c(o); }), "url");
  o.url = "http://127.0.0.1:6632";
  o.ca_file = "/nonexistent/ca.crt";
  EXPECT_EQ(refused_field([&] { Client c(o); }), "ca_file");
}

TEST(Client, TakesItsRouteFromTheEnvironment) {
  ASSERT_EQ(setenv("QUEEN_LOCKS_URL", "http://127.0.0.1:6632", 1), 0);
  Client c;
  EXPECT_EQ(c.url(), "http://127.0.0.1:6632/api/v1/locks");
  EXPECT_EQ(c.namespace_name(), "");
  queen_locks::Options o;
  o.url = "https://queen-locks.team-a.svc:6632/";
  o.namespace_ = "team-a";
  Client d(o);
  EXPECT_EQ(d.url(), "https://queen-locks.team-a.svc:6632/api/v1/locks");
  EXPECT_EQ(d.namespace_name(), "team-a");
  ASSERT_EQ(unsetenv("QUEEN_LOCKS_URL"), 0);
}

TEST(Handle, MintsAnOwnerOfHostPidAndRandom) {
  Nowhere nowhere;
  Handle a = nowhere.client().lock("x", 30s), b = nowhere.client().lock("x", 30s);
  EXPECT_TRUE(std::regex_match(a.owner(), std::regex(".+:" + std::to_string(getpid()) + ":[0-9a-f]{8}"))) << a.owner();
  EXPECT_NE(a.owner(), b.owner());
  EXPECT_EQ(a.name(), "x");
  EXPECT_EQ(a.limit(), 1);
  EXPECT_EQ(a.ttl(), 30s);
  EXPECT_FALSE(a.held());
  EXPECT_EQ(a.token(), 0u);
  EXPECT_EQ(a.slot(), -1);
  EXPECT_FALSE(a.guard().has_value());
  EXPECT_FALSE(a.lost_reason().has_value());
  EXPECT_FALSE(a.keep_alive()) << "nothing held: nothing to keep";
  EXPECT_FALSE(a.check());
  a.release();  // nothing held: a no-op
  EXPECT_EQ(nowhere.proxy.calls.load(), 0);
}

TEST(Handle, AMovedFromHandleSaysSo) {
  Nowhere nowhere;
  Handle a = nowhere.client().lock("moved", 30s);
  Handle b = std::move(a);
  EXPECT_EQ(b.name(), "moved");
  EXPECT_THROW(a.acquire(), queen_locks::Error);  // NOLINT(bugprone-use-after-move): the point of the test
  Handle c = nowhere.client().lock("other", 30s);
  c = std::move(b);
  EXPECT_EQ(c.name(), "moved");
}

TEST(Handle, ARouteThatDoesNotAnswerIsUnavailableAndAskedAgainWithinTheWait) {
  Nowhere nowhere;
  Handle h = nowhere.client().lock("nobody-home", 30s);
  EXPECT_THROW(h.acquire(), queen_locks::Unavailable);
  EXPECT_EQ(nowhere.proxy.calls.load(), 1);
  EXPECT_THROW(h.acquire(1s), queen_locks::Unavailable);
  EXPECT_GE(nowhere.proxy.calls.load(), 3) << "the wait should have asked again";
  EXPECT_FALSE(h.held());
  bool ran = false;
  EXPECT_THROW(h.run([&] { ran = true; }), queen_locks::Unavailable);
  EXPECT_FALSE(ran);
}

TEST(Handle, ATokenFileThatIsNamedMustExist) {
  Nowhere nowhere;
  queen_locks::Options o;
  o.url = nowhere.proxy.url();
  o.token_file = "/nonexistent/token";
  Handle h = Client(o).lock("x", 30s);
  try {
    h.acquire();
    FAIL() << "acquired without the named token file";
  } catch (const queen_locks::Unavailable& e) {
    FAIL() << "a missing token file is not a route without an answer: " << e.what();
  } catch (const queen_locks::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(nowhere.proxy.calls.load(), 0);
}

TEST(Names, LostReasonsAndGuardsAreSpelledAsTheContractDoes) {
  EXPECT_STREQ(queen_locks::to_string(queen_locks::LostReason::renew), "renew");
  EXPECT_STREQ(queen_locks::to_string(queen_locks::LostReason::guard), "guard");
  EXPECT_STREQ(queen_locks::to_string(queen_locks::LostReason::expired), "expired");
  queen_locks::Guard g{"check", "queen-locks", "team-a", "daily-report#0", 90101, true};
  EXPECT_EQ(g.annotation(), "daily-report#0=90101");
}

}  // namespace
