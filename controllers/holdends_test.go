package controllers

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

func holdCount(t *testing.T, ns, end string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := holdTime.WithLabelValues(ns, end).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// A permit reconciled twice before the informer shows it gone is deleted
// twice: the second delete answers not found. The holding still ended by
// the controller's first delete, whichever order the answers and the
// informer's event come in.
func TestASecondDeleteOfTheSamePermitIsNoRelease(t *testing.T) {
	notFound := errors.New("not found")
	for name, steps := range map[string][]string{
		"informer last":           {"deleting", "ok", "deleting", "notfound", "informer"},
		"informer between":        {"deleting", "ok", "informer", "deleting", "notfound"},
		"informer before both":    {"deleting", "deleting", "informer", "ok", "notfound"},
		"not found answers first": {"deleting", "deleting", "notfound", "ok", "informer"},
	} {
		t.Run(name, func(t *testing.T) {
			ns := "ns-" + name
			goneBefore, releasedBefore := holdCount(t, ns, EndPodGone), holdCount(t, ns, EndReleased)
			now := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
			h := newHoldEnds(clocktesting.NewFakePassiveClock(now))
			p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l.0", UID: "u1"}}
			p.Spec.AcquireTime = &metav1.MicroTime{Time: now.Add(-time.Minute)}
			for _, s := range steps {
				switch s {
				case "deleting":
					h.deleting(p, EndPodGone)
				case "ok":
					h.deleted(p, nil)
				case "notfound":
					h.deleted(p, notFound)
				case "informer":
					h.onDelete(p)
				}
			}
			if got := holdCount(t, ns, EndPodGone) - goneBefore; got != 1 {
				t.Errorf("pod-gone holdings %d, want 1", got)
			}
			if got := holdCount(t, ns, EndReleased) - releasedBefore; got != 0 {
				t.Errorf("released holdings %d, want 0", got)
			}
			if len(h.own) != 0 {
				t.Errorf("%d deletes still remembered", len(h.own))
			}
		})
	}
	// A delete that only ever failed was not the controller's: a release.
	ns := "ns-failed"
	releasedBefore, expiredBefore := holdCount(t, ns, EndReleased), holdCount(t, ns, EndExpired)
	h := newHoldEnds(clocktesting.NewFakePassiveClock(time.Now()))
	p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l.0", UID: "u2"}}
	p.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now()}
	h.deleting(p, EndExpired)
	h.onDelete(p)
	h.deleted(p, notFound)
	if holdCount(t, ns, EndReleased)-releasedBefore != 1 || holdCount(t, ns, EndExpired) != expiredBefore {
		t.Error("a delete that failed was counted as the controller's")
	}
}
