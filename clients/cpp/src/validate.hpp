// Checks of a handle's arguments, made before any request (section 6 of
// the contract), and the owner a handle mints for itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace queen_locks::detail {

constexpr std::size_t kMaxNameBytes = 256;
constexpr std::size_t kMaxOwnerBytes = 256;
constexpr std::int64_t kMaxTtlSeconds = 31536000;
constexpr int kMaxLimit = 1024;

// Throw InvalidArgument naming the field when the value is out of bounds.
void validate_name(const std::string& name);
void validate_limit(int n);
void validate_owner(const std::string& owner);
// The whole seconds the server counts: ttl rounded up.
std::int64_t validate_ttl(std::chrono::milliseconds ttl);
void validate_wait(std::chrono::milliseconds wait);

// host:pid:random, unique to this process and call.
std::string mint_owner();

}  // namespace queen_locks::detail
