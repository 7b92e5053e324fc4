package webhook

import "testing"

func TestPointerEscapesKeys(t *testing.T) {
	for keys, want := range map[[3]string]string{
		{"metadata", "annotations", "locks.queen.dev/fence"}: "/metadata/annotations/locks.queen.dev~1fence",
		{"metadata", "labels", "a~b/c"}:                      "/metadata/labels/a~0b~1c",
	} {
		if got := pointer(keys[:]...); got != want {
			t.Errorf("pointer(%q) = %q, want %q", keys, got, want)
		}
	}
}
