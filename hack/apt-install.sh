#!/usr/bin/env bash
# apt-install.sh PACKAGE...: installs from the distribution's packages
# those of PACKAGE that are not installed yet, for the scripts under
# hack/handles/ (one per toolchain; make handle-deps runs them all).
# Idempotent and quiet: apt-get runs only when a package is missing, the
# package lists are refreshed only then, and apt's output is shown only
# when it fails. It waits for dpkg's lock rather than failing on it, since
# other install scripts may run at the same time. Runs apt-get through sudo
# when not root.
set -euo pipefail
(($#)) || { echo "usage: $0 PACKAGE..." >&2; exit 2; }
missing=()
for p in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
((${#missing[@]})) || exit 0
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi
echo ">> installing ${missing[*]} from the distribution's packages" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq &&
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
