#!/usr/bin/env bash
# Installs what the C++ handle (clients/cpp) and its tests need, from
# Debian's packages only: a C++17 compiler, CMake and make, libcurl (the
# OpenSSL flavour) and nlohmann-json; for the tests GoogleTest, and
# libssl-dev for their https proxy. Idempotent and quiet: the package lists
# are refreshed only when a package is missing, and apt's output is shown
# only when it fails. Run as root (CI runs it before `make test`).
set -euo pipefail
packages=(g++ make cmake libcurl4-openssl-dev nlohmann-json3-dev libgtest-dev libssl-dev)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
((${#missing[@]})) || exit 0
echo ">> installing ${missing[*]} from Debian's packages" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Other install scripts may run at the same time: wait for apt's lock
# instead of failing on it.
if ! { apt-get -o DPkg::Lock::Timeout=600 update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
