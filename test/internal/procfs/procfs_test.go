package procfs

import (
	"os"
	"strings"
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

// Each walks every readable process, this one among them, and stops when
// asked to.
func TestEach(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	self, seen := false, 0
	if err := Each("cmdline", func(pid int, raw []byte) bool {
		seen++
		if pid == os.Getpid() && strings.HasPrefix(string(raw), os.Args[0]+"\x00") {
			self = true
		}
		return true
	}); err != nil || !self {
		t.Fatalf("walked %d processes, this one found %v: %v", seen, self, err)
	}
	calls := 0
	if err := Each("cmdline", func(int, []byte) bool { calls++; return false }); err != nil || calls != 1 {
		t.Fatalf("%d calls after the first answered false: %v", calls, err)
	}
}
