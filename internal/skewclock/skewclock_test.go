package skewclock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTheOffsetFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offset")
	if err := Write(path, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c, err := FromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(c.Now()); d < 400*time.Millisecond || d > 600*time.Millisecond {
		t.Fatalf("ahead by %s, want about 500ms", d)
	}
	if err := Write(path, -300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := time.Until(c.Now())
		if d < -200*time.Millisecond && d > -400*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s off after the file said -300ms", d)
		}
		time.Sleep(Poll)
	}
}

func TestAnUnreadableOffsetIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offset")
	if _, err := FromFile(path); err == nil {
		t.Fatal("a missing file was accepted")
	}
	if err := os.WriteFile(path, []byte("soon"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FromFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("an offset that is no duration: %v", err)
	}
}
