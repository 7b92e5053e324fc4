#!/usr/bin/env bash
# Installs Debian's Chromium for the Locks page's browser test
# (internal/dashboard, driven over the DevTools protocol). Idempotent and
# quiet: the package lists are refreshed only when it is missing. Run as
# root (CI runs it before `make test`, where CI=true makes the browser test
# fail rather than skip without it).
set -euo pipefail
packages=(chromium)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo ">> installing ${missing[*]} from Debian's packages" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
