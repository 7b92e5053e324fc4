//go:build tools

// Package etcd records the etcd server this module builds.
package etcd

import _ "go.etcd.io/etcd/server/v3"
