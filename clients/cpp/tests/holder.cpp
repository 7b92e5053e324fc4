// A holder for the cross-language agreement test (clients/cpp_test.go),
// which checks that every handle sees the others' locks. Not a test itself.
//
//   queen-locks-holder hold NAME   acquire, print {"acquired", "owner", "token"},
//                                  hold (at the keep_alive checkpoint) until
//                                  stdin closes, then release
//   queen-locks-holder try NAME    acquire once, print {"acquired", "owner",
//                                  "reason", "holders"}, release if acquired
//
// The route is $QUEEN_LOCKS_URL, the namespace $QUEEN_LOCKS_TEST_NAMESPACE.
#include <poll.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "queen_locks/queen_locks.hpp"

namespace {

// Waits for stdin to close, keeping the lock meanwhile: a second between
// checkpoints is far less than a third of its 30 s lifetime.
bool hold_until_stdin_closes(queen_locks::Handle& lock) {
  char buf[256];
  for (;;) {
    pollfd in{0, POLLIN, 0};
    int ready = poll(&in, 1, 1000);
    if (ready > 0 && read(0, buf, sizeof buf) <= 0) return true;
    if (!lock.keep_alive()) return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "hold" && mode != "try") {
    std::cerr << "usage: queen-locks-holder hold|try NAME\n";
    return 2;
  }
  try {
    queen_locks::Options o;
    if (const char* ns = std::getenv("QUEEN_LOCKS_TEST_NAMESPACE")) o.namespace_ = ns;
    queen_locks::Handle lock = queen_locks::Client(o).lock(argv[2], 30s);
    bool acquired = lock.acquire();
    nlohmann::json holders = nlohmann::json::array();
    for (const auto& h : lock.holders()) holders.push_back({{"slot", h.slot}, {"owner", h.owner}, {"token", h.token}});
    nlohmann::json out = {{"acquired", acquired}, {"owner", lock.owner()}, {"token", lock.token()},
                          {"reason", lock.reason()}, {"holders", holders}};
    std::cout << out.dump() << std::endl;
    if (acquired && mode == "hold" && !hold_until_stdin_closes(lock)) {
      std::cerr << "lost the lock: " << queen_locks::to_string(*lock.lost_reason()) << "\n";
      return 1;
    }
    lock.release();
  } catch (const queen_locks::Error& e) {
    std::cerr << "queen-locks-holder: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
