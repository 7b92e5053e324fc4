#!/usr/bin/env bash
# Installs Prometheus and promtool from Debian's packages, for the
# monitoring tests (test/monitoring): promtool checks and unit-tests the
# chart's alerting rules, and the Go test scrapes a real manager with a real
# Prometheus server that it starts itself on a loopback port. Idempotent and
# quiet: the package lists are refreshed only when a package is missing, and
# apt's output is shown only when it fails. Run as root (CI runs it before
# `make test`).
#
# The package ships a system service listening on :9090. The tests start
# their own server, so the service is stopped and disabled: nothing of this
# script keeps a port open.
set -euo pipefail
# No recommends (the helper installs none): the node exporter would be
# one more service.
bash "$(dirname "${BASH_SOURCE[0]}")/../apt-install.sh" prometheus

# Stop and disable the packaged service, whichever init runs it. Each step
# may find nothing to do (a container without an init, a policy that kept
# the service from starting), which is fine.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
else
  if [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
  if command -v update-rc.d >/dev/null; then
    update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi
for tool in prometheus promtool; do
  command -v "$tool" >/dev/null || { echo "$tool is not on PATH after installing prometheus" >&2; exit 1; }
done
