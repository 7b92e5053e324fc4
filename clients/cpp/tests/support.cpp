#include "support.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace qlt {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string url() { return env("QUEEN_LOCKS_TEST_URL"); }
std::string ns() { return env("QUEEN_LOCKS_TEST_NAMESPACE"); }
std::string tls_dir() { return env("QUEEN_LOCKS_TEST_TLS_DIR"); }
bool have_kubectl() { return !env("QUEEN_LOCKS_TEST_KUBECONFIG").empty() && !env("QUEEN_LOCKS_TEST_KUBECTL").empty(); }

queen_locks::Client client(const std::string& u) {
  queen_locks::Options o;
  o.url = u.empty() ? url() : u;
  o.namespace_ = ns();
  return queen_locks::Client(o);
}

std::string unique(const std::string& prefix) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  char hex[8];
  std::snprintf(hex, sizeof hex, "%06x", static_cast<unsigned>(rng() & 0xFFFFFF));
  return prefix + "-" + hex;
}

namespace {

// A temporary file, removed when this goes.
struct TempFile {
  std::string path;
  int fd = -1;
  TempFile() {
    std::string dir = env("TMPDIR").empty() ? "/tmp" : env("TMPDIR");
    std::string t = dir + "/queen-locks-cpp-XXXXXX";
    fd = mkstemp(t.data());
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    path = t;
  }
  ~TempFile() {
    close(fd);
    unlink(path.c_str());
  }
  std::string read() const {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

}  // namespace

Ran run(const std::vector<std::string>& argv, const std::string& input) {
  // Files, not pipes: nothing to pump while the child runs.
  TempFile in, out, err;
  if (!input.empty()) {
    std::ofstream(in.path) << input;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in.path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out.fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err.fd, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  Ran r;
  if (rc != 0) {
    r.err = "cannot start " + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = out.read();
  r.err = err.read();
  return r;
}

Ran kubectl(std::vector<std::string> args, const std::string& input) {
  std::vector<std::string> argv = {env("QUEEN_LOCKS_TEST_KUBECTL"), "--kubeconfig", env("QUEEN_LOCKS_TEST_KUBECONFIG")};
  if (!ns().empty()) {
    argv.push_back("-n");
    argv.push_back(ns());
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, input);
}

void delete_permit(const std::string& lock, int slot) {
  Ran r = kubectl({"delete", "queenlock", lock + "." + std::to_string(slot), "--wait=false"});
  ASSERT_EQ(r.code, 0) << "kubectl delete: " << r.err;
}

Ran write_configmap(const std::string& name, const std::string& guard, const std::string& value, bool create) {
  // Names and values of these tests need no JSON escaping.
  std::string cm = R"({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":")" + name +
                   R"(","labels":{"locks.queen.dev/guarded":"true"},"annotations":{"locks.queen.dev/guard":")" + guard +
                   R"("}},"data":{"report":")" + value + R"("}})";
  return kubectl({create ? "create" : "replace", "-f", "-"}, cm);
}

long long renew_writes() {
  Ran r = run({env("QUEEN_LOCKS_TEST_KUBECTL"), "--kubeconfig", env("QUEEN_LOCKS_TEST_KUBECONFIG"), "get", "--raw", "/metrics"});
  if (r.code != 0) {
    ADD_FAILURE() << "kubectl get --raw /metrics: " << r.err;
    return -1;
  }
  // apiserver_request_total{code="200",...,resource="queenlocks",...,verb="PUT",...} 7
  long long sum = 0;  // no PUT yet is a count of 0
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("apiserver_request_total{", 0) != 0) continue;
    if (line.find("resource=\"queenlocks\"") == std::string::npos || line.find("verb=\"PUT\"") == std::string::npos) continue;
    sum += std::stoll(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

bool wait_for(const std::string& what, const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) {
      ADD_FAILURE() << "waiting for " << what << ": gave up after " << timeout.count() << "ms";
      return false;
    }
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::chrono::system_clock::time_point parse_time(const std::string& s) {
  std::tm tm{};
  int micros = 0;
  char frac[16] = {0};
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6) {
    ADD_FAILURE() << "not an RFC 3339 time: " << s;
    return {};
  }
  if (std::sscanf(s.c_str() + 19, ".%15[0-9]", frac) == 1) {
    std::string f = std::string(frac).substr(0, 6);
    f.resize(6, '0');
    micros = std::stoi(f);
  }
  EXPECT_EQ(s.back(), 'Z') << "the route writes UTC times: " << s;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return std::chrono::system_clock::from_time_t(timegm(&tm)) + std::chrono::microseconds(micros);
}

}  // namespace qlt
