#!/usr/bin/env bash
# Builds the kube-apiserver of one compatibility version (make compat) from
# its tools module hack/kube-<minor> into bin/compat/<minor>/, unless that
# directory already holds that exact build, and links bin/etcd and
# bin/kubectl beside it, so that the directory is a whole KUBEBUILDER_ASSETS.
# It builds as hack/build-tools.sh does (the same stamp, the same version
# ldflags), only into another directory.
#
#   hack/compat-build.sh <minor>        e.g. hack/compat-build.sh 1.35
#
# etcd and kubectl are bin/'s own (make control-plane builds them): etcd is
# the storage, not the version under test, and envtest only records
# kubectl's path; the suites that run kubectl run bin/kubectl.
set -euo pipefail
minor=${1:?usage: hack/compat-build.sh <minor>, e.g. 1.35}
root=$(cd "$(dirname "$0")/.." && pwd)
moddir="hack/kube-$minor"
out="$root/bin/compat/$minor"
pkg=k8s.io/kubernetes/cmd/kube-apiserver
if [[ ! -f "$root/$moddir/go.mod" ]]; then
  echo "no tools module $moddir for Kubernetes $minor" >&2
  exit 1
fi
for t in etcd kubectl; do
  if [[ ! -x "$root/bin/$t" ]]; then
    echo "bin/$t is missing: run 'make control-plane' first" >&2
    exit 1
  fi
done
mkdir -p "$out"
ln -sfn ../../etcd "$out/etcd"
ln -sfn ../../kubectl "$out/kubectl"

want="$pkg v2 $(cat "$root/$moddir/go.mod" "$root/$moddir/go.sum" | sha256sum | cut -d' ' -f1)"
stamp="$out/.kube-apiserver.version"
if [[ -x "$out/kube-apiserver" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
v=$(cd "$root/$moddir" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [[ $v != "v$minor".* ]]; then
  echo "$moddir pins k8s.io/kubernetes $v, not a $minor release" >&2
  exit 1
fi
echo ">> building kube-apiserver $v into bin/compat/$minor/" >&2
start=$(date +%s)
IFS=. read -r major minor_n _ <<<"${v#v}"
ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor_n -X $p.gitTreeState=clean"
done
rm -f "$stamp"
(cd "$root/$moddir" && go build -ldflags "$ldflags" -o "$out/kube-apiserver" "$pkg")
got=$("$out/kube-apiserver" --version)
if [[ $got != "Kubernetes $v" ]]; then
  echo "bin/compat/$minor/kube-apiserver says '$got', want 'Kubernetes $v'" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo ">> built kube-apiserver $v in $(( $(date +%s) - start ))s" >&2
