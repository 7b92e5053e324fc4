//go:build chaos && !chaosbug

package main

import "github.com/queen-locks/queen-locks/internal/manager"

// testBugs does nothing: the deliberate bugs make chaos is checked against
// exist only in a build with the chaosbug tag (bugs_chaosbug.go).
func testBugs(*manager.Options) error { return nil }
