package procfs

import (
	"os"
	"testing"
)

func TestKB(t *testing.T) {
	text := "Name:\tx\nVmRSS:\t  2048 kB\nBad:\tlots kB\n"
	for key, want := range map[string]int64{"VmRSS:": 2048, "Bad:": -1, "Missing:": -1, "Name:": -1} {
		if got := kB(text, key); got != want {
			t.Errorf("kB(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestHasArg(t *testing.T) {
	args := []string{"kube-apiserver", "--cert-dir=/a", "--data-dir", "/b", "--x"}
	for _, c := range []struct {
		flag, value string
		want        bool
	}{{"--cert-dir", "/a", true}, {"--data-dir", "/b", true}, {"--cert-dir", "/b", false}, {"--x", "", false}} {
		if got := hasArg(args, c.flag, c.value); got != c.want {
			t.Errorf("hasArg(%s, %s) = %v, want %v", c.flag, c.value, got, c.want)
		}
	}
}

// This process's own figures are there on any Linux machine.
func TestOwnFigures(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	if RSS("self") <= 0 {
		t.Error("this process has no resident memory")
	}
	if Meminfo("MemTotal:") <= 0 {
		t.Error("the machine has no memory")
	}
	if LoadAvg() == "unknown" {
		t.Error("no load average")
	}
}
