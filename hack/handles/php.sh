#!/usr/bin/env bash
# Installs what the PHP handle (clients/php) and its tests need, from
# Debian's packages only: the PHP 8.2 CLI with curl (json is built in) and
# PHPUnit. Idempotent and quiet: the package lists are refreshed only when
# a package is missing. Run as root (CI runs it before `make test`).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/../apt-install.sh" php8.2-cli php8.2-curl phpunit
