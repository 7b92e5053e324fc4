// What the tests share: where the route is, kubectl, the API server's
// write counts, and waiting for a condition.
//
// The live tests need a route. `go test ./clients/ -run TestCppHandle` starts
// a control plane and sets the variables below; by hand, against `make dev`:
//
//   export QUEEN_LOCKS_TEST_URL=http://localhost:6632 QUEEN_LOCKS_TEST_NAMESPACE=default
//   export QUEEN_LOCKS_TEST_KUBECONFIG=.dev/kubeconfig QUEEN_LOCKS_TEST_KUBECTL=bin/kubectl
//   ctest --test-dir BUILD --output-on-failure
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "queen_locks/queen_locks.hpp"

namespace qlt {

using namespace std::chrono_literals;

std::string env(const char* name);
// QUEEN_LOCKS_TEST_URL, _NAMESPACE, _KUBECONFIG, _KUBECTL, _TLS_DIR.
std::string url();
std::string ns();
std::string tls_dir();
bool have_kubectl();

// A client of the test route (or of url, a proxy in front of it).
queen_locks::Client client(const std::string& url = "");
// A lock name no other run has used.
std::string unique(const std::string& prefix);

struct Ran {
  int code = -1;
  std::string out, err;
};
// Runs argv (no shell), feeding it input, and answers its exit code and
// output.
Ran run(const std::vector<std::string>& argv, const std::string& input = "");
// kubectl with the test kubeconfig, in the test namespace.
Ran kubectl(std::vector<std::string> args, const std::string& input = "");
// Deletes the permit of a simply named lock, as an operator would.
void delete_permit(const std::string& lock, int slot = 0);
// Writes a guarded ConfigMap carrying the guard annotation, as every write
// to one must.
Ran write_configmap(const std::string& name, const std::string& guard, const std::string& value, bool create);
// Writes to queenlocks with the verb the route's renew uses (a merge patch),
// as kube-apiserver counts them in apiserver_request_total.
long long renew_writes();

// Waits until cond() holds, checking every 20 ms; fails the test after
// timeout.
bool wait_for(const std::string& what, const std::function<bool()>& cond, std::chrono::milliseconds timeout = 30s);

// A duration in whole milliseconds: what the tests compare, so that a
// failure prints numbers.
template <class Rep, class Period>
long long ms(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// An RFC 3339 time of the route as a system_clock time.
std::chrono::system_clock::time_point parse_time(const std::string& rfc3339);

}  // namespace qlt

// A live test needs the route; it is skipped (and go test fails on any skip)
// without it.
#define QLT_NEED_ROUTE()                                                                              \
  do {                                                                                                \
    if (qlt::url().empty())                                                                           \
      GTEST_SKIP() << "QUEEN_LOCKS_TEST_URL is not set: this test needs a running route (go test "   \
                      "./clients/ -run TestCppHandle sets it)";                                       \
  } while (0)

#define QLT_NEED_KUBECTL()                                                                            \
  do {                                                                                                \
    QLT_NEED_ROUTE();                                                                                 \
    if (!qlt::have_kubectl())                                                                         \
      GTEST_SKIP() << "QUEEN_LOCKS_TEST_KUBECONFIG and QUEEN_LOCKS_TEST_KUBECTL are not set: this "   \
                      "test deletes a permit or writes a ConfigMap with kubectl";                    \
  } while (0)
