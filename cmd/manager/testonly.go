//go:build chaos || chaosbug

package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/internal/skewclock"
)

// Settings for make chaos alone (docs/development/safety.md). Only a
// manager built with -tags chaos (or chaosbug, whose bugs are run by the
// same harness) has them, so the manager that ships cannot be run on a
// skewed clock by mistake; even there they are left out of -help.
var testClockOffsetFile = flag.String("test-clock-offset-file", "",
	"TEST ONLY (make chaos): run the manager's clock (webhook stamps, expiry, route) offset from the machine's by the duration in this file, re-read as it changes.")

func init() {
	flag.Usage = func() {
		out := flag.CommandLine.Output()
		fmt.Fprintf(out, "Usage of %s:\n", os.Args[0])
		all := flag.CommandLine
		visible := flag.NewFlagSet(all.Name(), flag.ContinueOnError)
		visible.SetOutput(out)
		all.VisitAll(func(f *flag.Flag) {
			if !strings.HasPrefix(f.Name, "test-") {
				visible.Var(f.Value, f.Name, f.Usage)
			}
		})
		visible.PrintDefaults()
	}
}

// applyTestOnly applies the test-only settings to o.
func applyTestOnly(o *manager.Options) error {
	if *testClockOffsetFile != "" {
		c, err := skewclock.FromFile(*testClockOffsetFile)
		if err != nil {
			return fmt.Errorf("--test-clock-offset-file: %w", err)
		}
		o.Clock = c
	}
	return testBugs(o)
}
