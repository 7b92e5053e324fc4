#include "token_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "queen_locks/errors.hpp"

namespace queen_locks::detail {

TokenFile::TokenFile(std::string path, bool required) : path_(std::move(path)), required_(required) {}

std::string TokenFile::read() {
  if (path_.empty()) return {};
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    if (errno == ENOENT && !required_) return {};
    throw Error("token file " + path_ + ": " + std::strerror(errno));
  }
  Stamp stamp{st.st_dev, st.st_ino, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
              static_cast<long long>(st.st_size)};
  std::lock_guard<std::mutex> lock(mu_);
  if (!seen_ || stamp != stamp_) {
    std::ifstream in(path_);
    if (!in) throw Error("token file " + path_ + ": cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string t = ss.str();
    auto first = t.find_first_not_of(" \t\r\n");
    auto last = t.find_last_not_of(" \t\r\n");
    token_ = first == std::string::npos ? std::string() : t.substr(first, last - first + 1);
    stamp_ = stamp;
    seen_ = true;
  }
  return token_;
}

}  // namespace queen_locks::detail
