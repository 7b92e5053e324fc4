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
exec bash "$(dirname "${BASH_SOURCE[0]}")/../apt-install.sh" qemu-user-static
