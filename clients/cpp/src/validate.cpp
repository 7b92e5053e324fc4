#include "validate.hpp"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <random>

#include "queen_locks/errors.hpp"

namespace queen_locks::detail {

namespace {

// Decodes one UTF-8 sequence at s[i]; answers the code point and moves i
// past it, or answers -1 for an invalid sequence.
long decode(const std::string& s, std::size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  int len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) return -1;
  long cp = len == 1 ? b : b & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) return -1;
    cp = (cp << 6) | (c & 0x3F);
  }
  // Overlong forms, surrogates and values past Unicode are not UTF-8.
  static constexpr long kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  i += len;
  return cp;
}

}  // namespace

void validate_name(const std::string& name) {
  if (name.empty()) throw InvalidArgument("name", "the lock name must not be empty");
  if (name.size() > kMaxNameBytes)
    throw InvalidArgument("name", "the lock name must be at most 256 bytes, got " + std::to_string(name.size()));
  for (std::size_t i = 0; i < name.size();) {
    std::size_t at = i;
    long cp = decode(name, i);
    if (cp < 0) throw InvalidArgument("name", "the lock name must be valid UTF-8 (byte " + std::to_string(at) + ")");
    if (cp == '#') throw InvalidArgument("name", "the lock name must not contain '#' (byte " + std::to_string(at) + ")");
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) {
      std::array<char, 8> hex{};
      std::snprintf(hex.data(), hex.size(), "%04lX", cp);
      throw InvalidArgument("name", "the lock name must not contain a control character (U+" + std::string(hex.data()) +
                                        " at byte " + std::to_string(at) + ")");
    }
  }
}

void validate_limit(int n) {
  if (n < 1 || n > kMaxLimit)
    throw InvalidArgument("n", "the semaphore size must be from 1 to 1024, got " + std::to_string(n));
}

void validate_owner(const std::string& owner) {
  if (owner.empty() || owner.size() > kMaxOwnerBytes)
    throw InvalidArgument("owner", "the owner must be 1 to 256 bytes, got " + std::to_string(owner.size()));
}

std::int64_t validate_ttl(std::chrono::milliseconds ttl) {
  if (ttl < std::chrono::seconds(1))
    throw InvalidArgument("ttl", "the lifetime must be at least 1s, got " + std::to_string(ttl.count()) + "ms");
  auto secs = std::chrono::ceil<std::chrono::seconds>(ttl).count();
  if (secs > kMaxTtlSeconds)
    throw InvalidArgument("ttl", "the lifetime must be at most 31536000s (a year), got " + std::to_string(secs) + "s");
  return secs;
}

void validate_wait(std::chrono::milliseconds wait) {
  if (wait.count() < 0) throw InvalidArgument("wait", "the wait must not be negative, got " + std::to_string(wait.count()) + "ms");
}

std::string mint_owner() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') std::snprintf(host.data(), host.size(), "localhost");
  std::random_device rd;
  std::array<char, 9> rnd{};
  std::snprintf(rnd.data(), rnd.size(), "%08x", static_cast<unsigned>(rd()));
  std::string owner = std::string(host.data()) + ":" + std::to_string(getpid()) + ":" + rnd.data();
  // A very long host name must not make the owner too long for the server.
  if (owner.size() > kMaxOwnerBytes) owner.erase(0, owner.size() - kMaxOwnerBytes);
  return owner;
}

}  // namespace queen_locks::detail
