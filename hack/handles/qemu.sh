#!/usr/bin/env bash
# Installs qemu-user-static from Debian's packages, for make image-test:
# test/e2e/image runs the image's linux/arm64 entrypoint on a linux/amd64
# machine (and the other way round) under qemu-aarch64-static (or
# qemu-x86_64-static), which it calls itself, so binfmt_misc need not be
# set up (in a container it usually cannot be). Without qemu that part of
# the test skips and says why. Idempotent and quiet: the package lists are
# refreshed only when the package is missing, and apt's output is shown
# only when it fails. Run as root (CI runs it before the tests).
set -euo pipefail
packages=(qemu-user-static)
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
