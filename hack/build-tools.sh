#!/usr/bin/env bash
# Builds one pinned tool from its tools module under hack/ into bin/, unless
# bin/ already holds that exact version. The version is read from the tools
# module's go.mod, so bumping a pin there is all it takes to rebuild.
#
#   hack/build-tools.sh <tool-name> <tools-module-dir> <package>
set -euo pipefail
name=$1 moddir=$2 pkg=$3
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
mkdir -p "$bin"
# The stamp is the tools module's go.sum and go.mod hashes plus the package: a
# change to any pin rebuilds.
want="$pkg v2 $(cat "$root/$moddir/go.mod" "$root/$moddir/go.sum" | sha256sum | cut -d' ' -f1)"
stamp="$bin/.$name.version"
if [[ -x "$bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo ">> building $name ($pkg) into bin/" >&2
start=$(date +%s)
ldflags=""
if [[ $pkg == k8s.io/kubernetes/* ]]; then
  # A plain go build of Kubernetes reports v0.0.0; stamp the pinned release
  # so the binaries say which Kubernetes they are, as the release builds do.
  v=$(cd "$root/$moddir" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
  IFS=. read -r major minor _ <<<"${v#v}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
fi
(cd "$root/$moddir" && go build -ldflags "$ldflags" -o "$bin/$name" "$pkg")
echo "$want" > "$stamp"
echo ">> built $name in $(( $(date +%s) - start ))s" >&2
