package permit

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

func waiterObj(name, owner string, limit int32, hold int64) *locksv1alpha1.QueenLockWaiter {
	return &locksv1alpha1.QueenLockWaiter{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"},
		Spec: locksv1alpha1.QueenLockWaiterSpec{Lock: "daily-report", Owner: owner, Limit: limit, TTLSeconds: 6, HoldSeconds: hold,
			HolderPod: &locksv1alpha1.PodRef{Name: "cron-8-x", UID: "u8"}},
	}
}

// A handover is admitted while the permit is still held (a release), and
// begins a holding: new times, the waiter's owner, limit and pod, and the
// waiter's own short lifetime, whoever writes it. Judging it against the
// line is the webhook's (JudgeHandover), not Stamp's.
func TestStampHandoverBeforeExpiry(t *testing.T) {
	for _, caller := range []Caller{{}, {Manager: true}, {PodNamespace: "team-b", PodName: "releaser", PodUID: "r"}} {
		old := stamped(t, lockObj("cron-7", 30), t0)
		obj := Handed(old, waiterObj("daily-report-x7k2p", "cron-8", 1, 30))
		stampedNow, err := Stamp(old, obj, t0.Add(5*time.Second), time.Second, caller)
		if err != nil || !stampedNow {
			t.Fatalf("caller %+v: handover refused: %v", caller, err)
		}
		if obj.Spec.Owner != "cron-8" || obj.Spec.TTLSeconds != 6 || obj.Spec.Waiter != "daily-report-x7k2p" ||
			!obj.Spec.AcquireTime.Time.Equal(t0.Add(5*time.Second)) || obj.Spec.FirstToken != 0 {
			t.Fatalf("caller %+v: handed permit = %+v", caller, obj.Spec)
		}
		if hp := obj.Spec.HolderPod; hp == nil || hp.Namespace != "team-a" || hp.Name != "cron-8-x" {
			t.Fatalf("caller %+v: holder pod = %+v, want the waiter's, in the permit's namespace", caller, hp)
		}
	}
}

func TestStampWaiterOnlyByAHandover(t *testing.T) {
	obj := lockObj("cron-7", 30)
	obj.Spec.Waiter = "someone"
	if _, err := Stamp(nil, obj, t0, time.Second, Caller{Manager: true}); err == nil || !strings.Contains(err.Error(), "handover") {
		t.Fatalf("a create naming a waiter: %v, want refused", err)
	}
	old := stamped(t, lockObj("cron-7", 30), t0)
	old.Spec.Waiter = "w1"
	renew := old.DeepCopy()
	renew.Spec.Waiter = "w2"
	renew.Spec.AcquireTime = old.Spec.AcquireTime
	renew.Spec.Owner = "cron-7"
	// Keeps acquireTime but names a new waiter: IsHandover says no (no
	// acquire), and a renew may not change it.
	if _, err := Stamp(old, renew, t0.Add(time.Second), time.Second, Caller{}); err == nil {
		t.Fatal("a renew that changes the waiter was admitted")
	}
	take := old.DeepCopy()
	take.Spec.AcquireTime = nil
	take.Spec.Owner = "cron-9"
	if _, err := Stamp(old, take, t0.Add(32*time.Second), time.Second, Caller{}); err != nil {
		t.Fatalf("takeover of an expired handed permit: %v", err)
	}
	if take.Spec.Waiter != "" {
		t.Fatalf("a takeover kept waiter %q", take.Spec.Waiter)
	}
	early := old.DeepCopy()
	early.Spec.AcquireTime = nil
	early.Spec.Owner = "cron-9"
	if _, err := Stamp(old, early, t0.Add(time.Second), time.Second, Caller{}); reasonOf(err) != ReasonHeld {
		t.Fatalf("a takeover of a live permit that names no new waiter: %v, want held", err)
	}
}

func TestJudgeHandoverToTheHeadOnly(t *testing.T) {
	old := stamped(t, lockObj("cron-7", 30), t0)
	head := waiterObj("w1", "cron-8", 1, 30)
	good := Handed(old, head)
	if _, err := Stamp(old, good, t0.Add(time.Second), time.Second, Caller{}); err != nil {
		t.Fatal(err)
	}
	if err := JudgeHandover(good, head); err != nil {
		t.Fatalf("a handover to the head refused: %v", err)
	}
	forged := Handed(old, waiterObj("w1", "thief", 1, 30))
	if err := JudgeHandover(forged, head); err == nil || !strings.Contains(err.Error(), "head of the line") {
		t.Fatalf("a handover to another owner: %v", err)
	}
	long := Handed(old, head)
	long.Spec.TTLSeconds = 3600
	if err := JudgeHandover(long, head); err == nil || !strings.Contains(err.Error(), "ttlSeconds") {
		t.Fatalf("a handover with a longer lifetime: %v", err)
	}
	if err := JudgeHandover(good, nil); err == nil || !strings.Contains(err.Error(), "no waiter") {
		t.Fatalf("a handover with nobody waiting: %v", err)
	}
}

func TestHandedTTL(t *testing.T) {
	w := waiterObj("w", "o", 1, 30)
	if got := HandedTTL(w); got != 6 {
		t.Fatalf("carried waiter: %d, want its own ttlSeconds 6", got)
	}
	w.Spec.HoldSeconds = 2
	if got := HandedTTL(w); got != 2 {
		t.Fatalf("carried waiter asking 2 s: %d", got)
	}
	w.Spec.Pod = &locksv1alpha1.PodRef{Name: "p", UID: "u"}
	w.Spec.HoldSeconds = 7200
	if got := HandedTTL(w); got != 7200 {
		t.Fatalf("gated pod: %d, want its permit's whole lifetime", got)
	}
}
