// Package lintconfig holds the tests of the lint configuration,
// .golangci.yml: that its rules fail the code they are there to stop. A
// linter that is on but matches nothing passes every tree, so each rule
// worth keeping gets a planted violation here.
package lintconfig
