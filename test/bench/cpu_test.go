package main

import (
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A /proc/PID/stat line whose command holds a space and a parenthesis:
	// utime 250 and stime 31 ticks of 10 ms.
	stat := "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 91853 0 0 0 250 31 0 0 20 0 18 0 1083 2171784 78029 18446744073709551615"
	if got := parseStatCPU(stat); got != 2810*time.Millisecond {
		t.Errorf("got %s, want 2.81s", got)
	}
	for _, bad := range []string{"", "1 (x) S 1", "1 (x) S 1 2 3 4 5 6 7 8 9 u s"} {
		if got := parseStatCPU(bad); got != 0 {
			t.Errorf("%q: got %s, want 0", bad, got)
		}
	}
}
