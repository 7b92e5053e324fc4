// A bearer token on disk, re-read when the file changes: the kubelet
// rotates a projected token by swapping a symlink, so the name stays and
// what it points at moves.
#pragma once

#include <mutex>
#include <string>
#include <tuple>

namespace queen_locks::detail {

class TokenFile {
 public:
  // required: a missing file is an error (the caller named it); otherwise
  // a missing file means no token.
  TokenFile(std::string path, bool required);
  // The token, or an empty string when there is none. Safe from any thread.
  std::string read();

 private:
  using Stamp = std::tuple<unsigned long, unsigned long, long long, long long>;
  std::string path_;
  bool required_;
  std::mutex mu_;
  bool seen_ = false;
  Stamp stamp_{};
  std::string token_;
};

}  // namespace queen_locks::detail
