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

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
[ "${#missing[@]}" -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Other installs may hold dpkg's lock for a while: wait for it.
"${sudo[@]}" apt-get -qq -o DPkg::Lock::Timeout=600 update >/dev/null
"${sudo[@]}" apt-get -qq -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >/dev/null
