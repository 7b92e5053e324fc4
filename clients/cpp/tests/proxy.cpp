#include "proxy.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>

namespace qlt {

namespace {

// host and port of an http(s)://host:port/... URL, and the rest after it.
void split(const std::string& url, std::string& host, int& port, std::string& path) {
  auto start = url.find("://") + 3;
  auto slash = url.find('/', start);
  std::string hostport = url.substr(start, slash - start);
  path = slash == std::string::npos ? "" : url.substr(slash);
  auto colon = hostport.rfind(':');
  host = hostport.substr(0, colon);
  port = colon == std::string::npos ? 80 : std::stoi(hostport.substr(colon + 1));
}

bool send_all(int fd, const char* p, int n) {
  while (n > 0) {
    auto w = send(fd, p, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<int>(w);
  }
  return true;
}

}  // namespace

Proxy::Proxy(const std::string& target, std::chrono::milliseconds delay, const Tls* tls) : delay_(delay) {
  // OpenSSL writes to a client that has gone must not end the test run.
  std::signal(SIGPIPE, SIG_IGN);
  std::string path;
  split(target, host_, port_, path);
  if (tls != nullptr) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr || SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, tls->key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      throw std::runtime_error("proxy: cannot load " + tls->cert_file + " and " + tls->key_file);
    tls_ = ctx;
  }
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener_, 64) != 0 ||
      getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("proxy: cannot listen on loopback");
  url_ = std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + path;
  acceptor_ = std::thread([this] { accept_loop(); });
}

Proxy::~Proxy() {
  cut();
  acceptor_.join();
  for (auto& t : conns_) t.join();
  if (tls_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(tls_));
}

void Proxy::cut() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cut_) return;
  cut_ = true;
  // shutdown wakes the threads blocked on these sockets; each closes its own.
  shutdown(listener_, SHUT_RDWR);
  for (int fd : open_) shutdown(fd, SHUT_RDWR);
}

void Proxy::accept_loop() {
  for (;;) {
    int c = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard<std::mutex> lock(mu_);
    if (cut_) {
      if (c >= 0) close(c);
      close(listener_);
      return;
    }
    if (c < 0) continue;
    calls++;
    bool d = false;
    for (int n = drop.load(); n > 0 && !d;) d = drop.compare_exchange_weak(n, n - 1);
    open_.insert(c);
    conns_.emplace_back([this, c, d] { serve(c, d); });
  }
}

void Proxy::serve(int c, bool drop_answer) {
  SSL* ssl = nullptr;
  int s = -1;
  auto finish = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(c);
    if (s >= 0) open_.erase(s);
    if (ssl != nullptr) SSL_free(ssl);
    close(c);
    if (s >= 0) close(s);
  };
  if (tls_ != nullptr) {
    ssl = SSL_new(static_cast<SSL_CTX*>(tls_));
    SSL_set_fd(ssl, c);
    if (SSL_accept(ssl) != 1) {  // a client that does not trust us
      ERR_clear_error();
      return finish();
    }
  }
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cut_) return finish();
    open_.insert(s);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  inet_pton(AF_INET, host_ == "localhost" ? "127.0.0.1" : host_.c_str(), &a.sin_addr);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return finish();
  char buf[65536];
  // One thread moves both directions: a TLS connection must not be read
  // and written from two threads at once.
  for (;;) {
    pollfd fds[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
    bool pending = ssl != nullptr && SSL_pending(ssl) > 0;
    if (!pending && poll(fds, 2, -1) < 0) return finish();
    if (pending || fds[0].revents != 0) {
      int n = ssl != nullptr ? SSL_read(ssl, buf, sizeof buf) : static_cast<int>(recv(c, buf, sizeof buf, 0));
      if (n <= 0) return finish();
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      if (!send_all(s, buf, n)) return finish();
    }
    if (fds[1].revents != 0) {
      int n = static_cast<int>(recv(s, buf, sizeof buf, 0));
      if (n <= 0 || drop_answer) return finish();  // a dropped answer: the client sees the connection close
      if (ssl != nullptr ? SSL_write(ssl, buf, n) != n : !send_all(c, buf, n)) return finish();
    }
  }
}

}  // namespace qlt
