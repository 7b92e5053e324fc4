package main

import (
	"testing"
	"time"
)

func TestTheShapesOfGatedPodsAreChecked(t *testing.T) {
	permitOf := func(life time.Duration) Event {
		return Event{Type: "ADDED", Version: 10, RenewTime: at(0), ExpireTime: at(0) + int64(life)}
	}
	r := Report{Gated: GatedFigures{Shapes: map[string]int{}}}
	r.checkShape(Hold{Pod: "one", Lock: Semaphore, Slot: 0, Limit: 1, Shape: ShapeLimitOne}, permitOf(time.Hour))
	r.checkShape(Hold{Pod: "grace", Lock: Lock, Slot: 0, Limit: 1, Shape: ShapeHugeGrace}, permitOf(365*24*time.Hour))
	if len(r.Violations) != 0 || r.Gated.Shapes[ShapeLimitOne] != 1 || r.Gated.Shapes[ShapeHugeGrace] != 1 {
		t.Fatalf("violations %q, shapes %v", r.Violations, r.Gated.Shapes)
	}
	r.checkShape(Hold{Pod: "one", Lock: Semaphore, Slot: 2, Limit: 1, Shape: ShapeLimitOne}, permitOf(time.Hour))
	mustFind(t, r, "asked limit 1 but holds slot 2")
	r.checkShape(Hold{Pod: "grace", Lock: Lock, Slot: 0, Limit: 1, Shape: ShapeHugeGrace}, permitOf(-time.Hour))
	mustFind(t, r, "not within a year")
}
