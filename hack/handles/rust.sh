#!/usr/bin/env bash
# Installs what the Rust handle (clients/rust) needs to build and test:
# the crates it depends on as Debian packages (librust-*-dev, unpacked under
# /usr/share/cargo/registry, which clients/rust/.cargo/config.toml points
# cargo at instead of any registry), OpenSSL's headers for native-tls, and,
# on a machine with no cargo at all, Debian's rustc and cargo.
# Idempotent and quiet: apt-get runs only when a package is missing.
set -euo pipefail

packages=(
	librust-ureq-dev
	librust-native-tls-dev
	librust-serde-dev
	librust-serde-derive-dev
	librust-serde-json-dev
	librust-url-dev
	librust-libc-dev
	libssl-dev
	pkg-config
	gcc
)
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
	packages+=(rustc cargo)
fi

exec bash "$(dirname "${BASH_SOURCE[0]}")/../apt-install.sh" "${packages[@]}"
