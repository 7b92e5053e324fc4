#!/usr/bin/env bash
# Installs the e2e node's container runtime from Debian's packages when it is
# missing: containerd (1.6 on Debian 12), runc, the CNI plugins, and
# iptables for kube-proxy. Nothing is started: make e2e runs containerd
# itself, with its state in the run's directory.
set -euo pipefail
need=()
command -v containerd >/dev/null && command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
if (( ${#need[@]} )); then
  echo ">> installing ${need[*]} from Debian's packages" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
