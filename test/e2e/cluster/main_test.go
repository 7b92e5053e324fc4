package cluster_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/test/e2e/cluster"
)

// c is the cluster every test of the package runs on, in source order.
var (
	c    *cluster.Cluster
	root string // the repository
	bin  string // its bin/
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("QUEEN_LOCKS_E2E") == "" {
		fmt.Println("skipping the cluster e2e tests: make e2e runs them (as root, with a node it builds)")
		os.Exit(0)
	}
	if !cluster.Inside() {
		os.Exit(cluster.Host(os.Args[1:]))
	}
	os.Exit(inside(m))
}

func inside(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root = filepath.Join(wd, "..", "..", "..")
	bin = filepath.Join(root, "bin")
	images := []string{
		filepath.Join(bin, "queen-locks-image.tar"),
		filepath.Join(bin, "e2e", "pause.tar"),
		filepath.Join(bin, "e2e", "report.tar"),
		filepath.Join(bin, "e2e", "fenced-controller.tar"),
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s e2e: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err = cluster.Start(ctx, cluster.Config{Bin: bin, Images: images}, logf)
	if err != nil {
		logf("starting the cluster: %v", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		if out, err := c.Kubectl(context.Background(), bin, "get", "pods,jobs,cronjobs,queenlocks", "-A", "-o", "wide"); err == nil {
			logf("at the end:\n%s", strings.TrimSpace(out))
		}
	}
	c.Stop()
	return code
}
