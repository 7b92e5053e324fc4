#!/usr/bin/env bash
# Installs what the C++ handle (clients/cpp) and its tests need, from
# Debian's packages only: a C++17 compiler, CMake and make, libcurl (the
# OpenSSL flavour) and nlohmann-json; for the tests GoogleTest, and
# libssl-dev for their https proxy. Idempotent and quiet: the package lists
# are refreshed only when a package is missing, and apt's output is shown
# only when it fails. Run as root (CI runs it before `make test`).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/../apt-install.sh" g++ make cmake libcurl4-openssl-dev nlohmann-json3-dev libgtest-dev libssl-dev
