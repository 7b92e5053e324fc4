// A loopback TCP proxy in front of the route, that a test can slow down,
// make lose answers, or cut.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace qlt {

class Proxy {
 public:
  struct Tls {
    std::string cert_file, key_file;
  };

  // target: the route's URL. delay holds back each piece of a request
  // before passing it on, so the server admits a write later than the
  // client sent it. With tls, the proxy serves https with that certificate.
  explicit Proxy(const std::string& target, std::chrono::milliseconds delay = std::chrono::milliseconds(0),
                 const Tls* tls = nullptr);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The target's URL with this proxy's address (and https with tls).
  const std::string& url() const { return url_; }
  // Stops it for good: the route stops answering, connections are refused.
  void cut();

  // How many of the next calls lose their answer: the request reaches the
  // route, the client sees the connection close.
  std::atomic<int> drop{0};
  // Connections accepted so far (one per call: the handle does not reuse
  // connections).
  std::atomic<int> calls{0};

 private:
  void accept_loop();
  void serve(int client, bool drop_answer);

  std::string host_, url_;
  int port_ = 0;
  int listener_ = -1;
  std::chrono::milliseconds delay_;
  void* tls_ = nullptr;  // SSL_CTX*
  std::mutex mu_;
  bool cut_ = false;
  std::set<int> open_;
  std::thread acceptor_;
  std::vector<std::thread> conns_;
};

}  // namespace qlt
