#!/usr/bin/env bash
# Installs what the PHP handle (clients/php) and its tests need, from
# Debian's packages only: the PHP 8.2 CLI with curl (json is built in) and
# PHPUnit. Idempotent and quiet: the package lists are refreshed only when
# a package is missing. Run as root (CI runs it before `make test`).
set -euo pipefail
packages=(php8.2-cli php8.2-curl phpunit)
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
