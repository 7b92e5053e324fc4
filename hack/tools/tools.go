//go:build tools

// Package tools records the generators and packagers this module builds.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
