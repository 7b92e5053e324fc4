package gatedpod

import (
	"strings"
	"testing"
	"time"
)

func TestParseAskNamesTheAnnotationAtFault(t *testing.T) {
	for _, c := range []struct {
		name string
		ann  map[string]string
		want string // "" for valid
	}{
		{"lock alone", map[string]string{LockAnnotation: "nightly"}, ""},
		{"all three", map[string]string{LockAnnotation: "licence", LimitAnnotation: "4", TTLAnnotation: "2h"}, ""},
		{"no lock", map[string]string{LimitAnnotation: "2"}, LockAnnotation + " is required"},
		{"empty lock", map[string]string{LockAnnotation: ""}, LockAnnotation + ": must not be empty"},
		{"hash in lock", map[string]string{LockAnnotation: "a#b"}, "'#'"},
		{"control character", map[string]string{LockAnnotation: "a\x01b"}, "control character"},
		{"long lock", map[string]string{LockAnnotation: strings.Repeat("x", 257)}, "at most 256 bytes"},
		{"limit text", map[string]string{LockAnnotation: "l", LimitAnnotation: "two"}, LimitAnnotation + `: "two" is not a whole number`},
		{"limit zero", map[string]string{LockAnnotation: "l", LimitAnnotation: "0"}, LimitAnnotation + ": must be from 1 to 1024"},
		{"limit huge", map[string]string{LockAnnotation: "l", LimitAnnotation: "99999999999999999999"}, LimitAnnotation},
		{"limit fraction", map[string]string{LockAnnotation: "l", LimitAnnotation: "1.5"}, LimitAnnotation},
		{"ttl text", map[string]string{LockAnnotation: "l", TTLAnnotation: "soon"}, TTLAnnotation + `: "soon" is not a duration`},
		{"ttl zero", map[string]string{LockAnnotation: "l", TTLAnnotation: "0s"}, TTLAnnotation + ": must be whole seconds from 1s"},
		{"ttl fraction", map[string]string{LockAnnotation: "l", TTLAnnotation: "1500ms"}, TTLAnnotation},
		{"ttl negative", map[string]string{LockAnnotation: "l", TTLAnnotation: "-1h"}, TTLAnnotation},
		{"ttl past a year", map[string]string{LockAnnotation: "l", TTLAnnotation: "8761h"}, TTLAnnotation},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseAsk(c.ann)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused a valid ask: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	a, err := ParseAsk(map[string]string{LockAnnotation: "licence", LimitAnnotation: "4", TTLAnnotation: "90m"})
	if err != nil || a.Lock != "licence" || a.Limit != 4 || a.TTL != 90*time.Minute {
		t.Fatalf("got %+v, %v", a, err)
	}
}

func TestCheckUnknownNamesAMisspeltAnnotation(t *testing.T) {
	if err := CheckUnknown(map[string]string{LockAnnotation: "x", TTLAnnotation: "30s", LimitAnnotation: "2", QueuedAt: "t", "example.com/other": "y"}); err != nil {
		t.Fatalf("known annotations and another prefix's: %v", err)
	}
	err := CheckUnknown(map[string]string{LockAnnotation: "x", "locks.queen.dev/tll": "30s", "locks.queen.dev/limt": "2"})
	if err == nil {
		t.Fatal("misspelt ttl and limit were accepted")
	}
	for _, want := range []string{"locks.queen.dev/limt, locks.queen.dev/tll", TTLAnnotation, LimitAnnotation} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
