//go:build tools

// Package kube records the command this module builds for make compat.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
