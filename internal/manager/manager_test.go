package manager

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func TestNegativeExpiryGraceIsRefused(t *testing.T) {
	// The host is never dialled: the grace is checked first.
	_, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, Options{ExpiryGrace: -500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "--expiry-grace is -500ms: it must not be negative") {
		t.Fatalf("err = %v", err)
	}
}
