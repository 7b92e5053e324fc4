package permit

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// lockObj builds a permit of "daily-report" slot 0 for owner with ttl seconds.
func lockObj(owner string, ttl int64) *locksv1alpha1.QueenLock {
	return &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Name: "daily-report.0", Namespace: "team-a"},
		Spec:       locksv1alpha1.QueenLockSpec{Lock: "daily-report", Slot: 0, Limit: 1, Owner: owner, TTLSeconds: ttl},
	}
}

// stamped is obj after an admitted create at t.
func stamped(t *testing.T, obj *locksv1alpha1.QueenLock, at time.Time) *locksv1alpha1.QueenLock {
	t.Helper()
	if _, err := Stamp(nil, obj, at, time.Second, Caller{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	obj.ResourceVersion = "100" // as storage assigns it
	return obj
}

func reasonOf(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return "?"
}

func TestStampCreateReplacesClientTimes(t *testing.T) {
	obj := lockObj("cron-7", 30)
	forged := metav1.NewMicroTime(t0.Add(24 * time.Hour))
	obj.Spec.AcquireTime, obj.Spec.RenewTime, obj.Spec.ExpireTime = &forged, &forged, &forged
	stamped(t, obj, t0)
	if !obj.Spec.AcquireTime.Time.Equal(t0) || !obj.Spec.RenewTime.Time.Equal(t0) || !obj.Spec.ExpireTime.Time.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("times = %v %v %v, want the server's", obj.Spec.AcquireTime, obj.Spec.RenewTime, obj.Spec.ExpireTime)
	}
	if obj.Labels[LockLabel] != "daily-report" {
		t.Fatalf("label = %q", obj.Labels[LockLabel])
	}
}

func TestStampTransitions(t *testing.T) {
	held := func() *locksv1alpha1.QueenLock { return stamped(t, lockObj("cron-7", 30), t0) }
	cases := []struct {
		name       string
		at         time.Duration // after t0
		edit       func(*locksv1alpha1.QueenLock)
		wantReason string // "" admitted, "invalid" for a field error
	}{
		{"renew by owner", 10 * time.Second, func(p *locksv1alpha1.QueenLock) {}, ""},
		{"renew with a new ttl", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.TTLSeconds = 60 }, ""},
		{"renew after expiry", 30 * time.Second, func(p *locksv1alpha1.QueenLock) {}, ReasonLost},
		{"renew by another owner", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.Owner = "thief" }, ReasonHeld},
		{"takeover before expiry", 29 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.AcquireTime = nil; p.Spec.Owner = "b" }, ReasonHeld},
		{"takeover at expiry", 30 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.AcquireTime = nil; p.Spec.Owner = "b" }, ""},
		{"acquireTime moved", 10 * time.Second, func(p *locksv1alpha1.QueenLock) {
			x := metav1.NewMicroTime(t0.Add(time.Second))
			p.Spec.AcquireTime = &x
		}, "invalid"},
		{"label edit", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Labels["x"] = "y" }, "invalid"},
		{"annotation edit", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Annotations = map[string]string{"x": "y"} }, "invalid"},
		{"finalizer", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Finalizers = []string{"x/y"} }, "invalid"},
		{"lock changed", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.Lock = "other" }, "invalid"},
		{"slot changed", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.Slot = 1; p.Spec.Limit = 2 }, "invalid"},
		{"ttl zero", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.TTLSeconds = 0 }, "invalid"},
		// Leader election (package election): the count changes only when
		// the permit changes hands, by one at most; the preferred holder and
		// strategy are the holding's.
		{"renew that counts a transition", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.LeaderTransitions = 1 }, "invalid"},
		{"renew that names a preferred holder", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.PreferredHolder = "b" }, "invalid"},
		{"renew that sets a strategy", 10 * time.Second, func(p *locksv1alpha1.QueenLock) { p.Spec.Strategy = "OldestEmulationVersion" }, "invalid"},
		{"takeover that counts a transition", 30 * time.Second, func(p *locksv1alpha1.QueenLock) {
			p.Spec.AcquireTime, p.Spec.Owner, p.Spec.LeaderTransitions, p.Spec.PreferredHolder = nil, "b", 1, "c"
		}, ""},
		{"takeover that counts two transitions", 30 * time.Second, func(p *locksv1alpha1.QueenLock) {
			p.Spec.AcquireTime, p.Spec.Owner, p.Spec.LeaderTransitions = nil, "b", 2
		}, "invalid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old := held()
			obj := old.DeepCopy()
			c.edit(obj)
			at := t0.Add(c.at)
			_, err := Stamp(old, obj, at, 0, Caller{})
			switch {
			case c.wantReason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.wantReason == "invalid" && reasonOf(err) != "":
				t.Fatalf("err = %v, want a field error", err)
			case c.wantReason != "" && c.wantReason != "invalid" && reasonOf(err) != c.wantReason:
				t.Fatalf("err = %v, want reason %q", err, c.wantReason)
			}
			if err != nil {
				return
			}
			if !obj.Spec.RenewTime.Time.Equal(at) || !obj.Spec.ExpireTime.Time.Equal(at.Add(time.Duration(obj.Spec.TTLSeconds)*time.Second)) {
				t.Fatalf("not stamped: renew %v expire %v", obj.Spec.RenewTime, obj.Spec.ExpireTime)
			}
		})
	}
}

func TestValidateSpecNamesTheField(t *testing.T) {
	obj := lockObj("cron-7", 30)
	obj.Name = "wrong"
	errs := ValidateSpec(obj)
	if len(errs) != 1 || errs[0].Field != "metadata.name" || !strings.Contains(errs[0].Detail, `"daily-report.0"`) {
		t.Fatalf("errs = %v", errs)
	}
	obj = lockObj("", 0)
	obj.Spec.Lock = ""
	obj.Spec.Limit = 0
	got := map[string]bool{}
	for _, e := range ValidateSpec(obj) {
		got[e.Field] = true
	}
	for _, f := range []string{"spec.lock", "spec.owner", "spec.ttlSeconds", "spec.limit"} {
		if !got[f] {
			t.Errorf("no error for %s in %v", f, got)
		}
	}
}

// A new lock or slot is told as what it is, not as the slot out of range
// or the object name it no longer matches.
func TestStampSaysLockAndSlotAreImmutable(t *testing.T) {
	for _, c := range []struct {
		edit func(*locksv1alpha1.QueenLock)
		want string
	}{
		{func(p *locksv1alpha1.QueenLock) { p.Spec.Lock = "other" }, `spec.lock: Invalid value: "other": is immutable ("daily-report")`},
		{func(p *locksv1alpha1.QueenLock) { p.Spec.Slot = 1 }, "spec.slot: Invalid value: 1: is immutable (0)"},
	} {
		old := stamped(t, lockObj("cron-7", 30), t0)
		obj := old.DeepCopy()
		c.edit(obj)
		_, err := Stamp(old, obj, t0.Add(time.Second), 0, Caller{})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "metadata.name") || strings.Contains(err.Error(), "limit-1") {
			t.Errorf("err = %v, want only %q", err, c.want)
		}
	}
}

func TestFormatTime(t *testing.T) {
	if got := FormatTime(t0.Add(1500 * time.Microsecond)); got != "2026-12-02T10:00:00.001500Z" {
		t.Fatalf("FormatTime = %q", got)
	}
}

func TestStampGraceHolderPodAndDeletion(t *testing.T) {
	const grace = time.Second
	held := func() *locksv1alpha1.QueenLock { return stamped(t, lockObj("cron-7", 30), t0) }
	takeover := func(p *locksv1alpha1.QueenLock) { p.Spec.AcquireTime = nil; p.Spec.Owner = "b" }
	// A takeover as the manager sends it (locks.AsManager): already
	// stamped, a new acquireTime in place of a cleared one.
	stampedTakeover := func(at time.Duration) func(*locksv1alpha1.QueenLock) {
		return func(p *locksv1alpha1.QueenLock) {
			p.Spec.Owner = "b"
			stamp(p, t0.Add(at), true)
		}
	}
	me := Caller{PodNamespace: "team-b", PodName: "job-x", PodUID: "u1"}
	cases := []struct {
		name       string
		at         time.Duration
		caller     Caller
		edit       func(*locksv1alpha1.QueenLock)
		wantReason string
	}{
		{"takeover within the grace", 30*time.Second + grace/2, Caller{}, takeover, ReasonHeld},
		{"takeover after the grace", 30*time.Second + grace, Caller{}, takeover, ""},
		{"the manager's stamped takeover", 31 * time.Second, Caller{Manager: true}, stampedTakeover(31 * time.Second), ""},
		{"the manager's stamped takeover within the grace", 30*time.Second + grace/2, Caller{Manager: true}, stampedTakeover(30*time.Second + grace/2), ReasonHeld},
		{"a stamped takeover from anyone else", 31 * time.Second, me, stampedTakeover(31 * time.Second), "invalid"},
		{"lock label edited", 10 * time.Second, Caller{}, func(p *locksv1alpha1.QueenLock) { p.Labels[LockLabel] = "other" }, "invalid"},
		{"lock label removed", 10 * time.Second, Caller{}, func(p *locksv1alpha1.QueenLock) { delete(p.Labels, LockLabel) }, "invalid"},
		{"holderPod added on renew", 10 * time.Second, Caller{}, func(p *locksv1alpha1.QueenLock) {
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Name: "job-x", UID: "u1"}
		}, "invalid"},
		{"holderPod set on takeover", 31 * time.Second, me, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "team-b", Name: "job-x", UID: "u1"}
		}, ""},
		{"holderPod without a namespace is the caller's pod", 31 * time.Second, me, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Name: "job-x", UID: "u1"}
		}, ""},
		{"holderPod of the same name in the permit's namespace", 31 * time.Second, me, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "team-a", Name: "job-x", UID: "u1"}
		}, "invalid"},
		{"holderPod named by a caller that is no pod", 31 * time.Second, Caller{}, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "team-b", Name: "job-x", UID: "u1"}
		}, "invalid"},
		{"holderPod named by the manager", 31 * time.Second, Caller{Manager: true}, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Namespace: "team-b", Name: "job-x", UID: "u1"}
		}, ""},
		{"holderPod of another pod", 31 * time.Second, me, func(p *locksv1alpha1.QueenLock) {
			takeover(p)
			p.Spec.HolderPod = &locksv1alpha1.PodRef{Name: "job-y", UID: "u2"}
		}, "invalid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old := held()
			obj := old.DeepCopy()
			c.edit(obj)
			_, err := Stamp(old, obj, t0.Add(c.at), grace, c.caller)
			switch {
			case c.wantReason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.wantReason == "invalid" && (err == nil || reasonOf(err) != ""):
				t.Fatalf("err = %v, want a field error", err)
			case c.wantReason != "" && c.wantReason != "invalid" && reasonOf(err) != c.wantReason:
				t.Fatalf("err = %v, want reason %q", err, c.wantReason)
			}
		})
	}

	// A permit being deleted: finalizers may go, nothing else may change.
	deleting := func() *locksv1alpha1.QueenLock {
		p := held()
		now := metav1.NewTime(t0)
		p.DeletionTimestamp, p.Finalizers = &now, []string{"foregroundDeletion", "x/y"}
		return p
	}
	obj := deleting()
	obj.Finalizers = []string{"x/y"}
	if stamped, err := Stamp(deleting(), obj, t0, grace, Caller{}); err != nil || stamped {
		t.Fatalf("finalizer removal: stamped %v, %v", stamped, err)
	}
	obj = deleting()
	obj.Finalizers = append(obj.Finalizers, "z/new")
	if _, err := Stamp(deleting(), obj, t0, grace, Caller{}); err == nil {
		t.Fatal("a finalizer was added to a permit being deleted")
	}
	obj = deleting()
	obj.Spec.TTLSeconds = 60
	if _, err := Stamp(deleting(), obj, t0, grace, Caller{}); reasonOf(err) != ReasonLost {
		t.Fatalf("renew of a permit being deleted: %v, want lost", err)
	}
}

func TestStampDefaultsTheHolderPodNamespace(t *testing.T) {
	for _, c := range []struct {
		name   string
		caller Caller
		want   string
	}{
		{"the writer's pod", Caller{PodNamespace: "team-b", PodName: "job-x", PodUID: "u1"}, "team-b"},
		{"the manager, for a pod it names without one", Caller{Manager: true}, "team-a"},
		// The webhook sees the manager's own pod-bound token; the manager,
		// stamping its writes itself, sees none. Both store the same.
		{"the manager seen by the webhook, with its own pod", Caller{Manager: true, PodNamespace: "queen-locks", PodName: "queen-locks-0", PodUID: "m1"}, "team-a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := lockObj("cron-7", 30)
			obj.Spec.HolderPod = &locksv1alpha1.PodRef{Name: "job-x", UID: "u1"}
			if _, err := Stamp(nil, obj, t0, time.Second, c.caller); err != nil {
				t.Fatal(err)
			}
			if got := obj.Spec.HolderPod.Namespace; got != c.want {
				t.Fatalf("holderPod.namespace = %q, want %q", got, c.want)
			}
		})
	}
}

// The first renew of a holding records the token its acquire answered;
// later renews keep it; a takeover starts a holding without one; whatever a
// client sends in it is replaced.
func TestStampRecordsTheHoldingsFirstToken(t *testing.T) {
	p := stamped(t, lockObj("cron-7", 30), t0)
	if p.Spec.FirstToken != 0 {
		t.Fatalf("created with firstToken %d", p.Spec.FirstToken)
	}
	renew := func(old *locksv1alpha1.QueenLock, at time.Duration, rv string, forged int64) *locksv1alpha1.QueenLock {
		t.Helper()
		obj := old.DeepCopy()
		obj.Spec.FirstToken = forged
		if _, err := Stamp(old, obj, t0.Add(at), time.Second, Caller{}); err != nil {
			t.Fatal(err)
		}
		obj.ResourceVersion = rv
		return obj
	}
	p = renew(p, 10*time.Second, "107", 5)
	if p.Spec.FirstToken != 100 {
		t.Fatalf("first renew: firstToken %d, want 100 (the acquire's token)", p.Spec.FirstToken)
	}
	p = renew(p, 20*time.Second, "130", 120)
	if p.Spec.FirstToken != 100 {
		t.Fatalf("second renew: firstToken %d, want 100 kept", p.Spec.FirstToken)
	}
	obj := p.DeepCopy()
	obj.Spec.AcquireTime, obj.Spec.Owner = nil, "b"
	if _, err := Stamp(p, obj, t0.Add(time.Minute), time.Second, Caller{}); err != nil {
		t.Fatal(err)
	}
	if obj.Spec.FirstToken != 0 {
		t.Fatalf("takeover kept firstToken %d of the earlier holding", obj.Spec.FirstToken)
	}
	created := lockObj("cron-7", 30)
	created.Spec.FirstToken = 1
	stamped(t, created, t0)
	if created.Spec.FirstToken != 0 {
		t.Fatalf("create kept the firstToken %d the client sent", created.Spec.FirstToken)
	}
}

func TestStampRefusesOwnerReferences(t *testing.T) {
	obj := lockObj("cron-7", 30)
	obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
	_, err := Stamp(nil, obj, t0, time.Second, Caller{})
	if err == nil || !strings.Contains(err.Error(), "metadata.ownerReferences") {
		t.Fatalf("create with ownerReferences: %v, want a refusal naming metadata.ownerReferences", err)
	}
}

// The gate's owners (pod:<uid>) are the manager's alone: anyone else's
// create, takeover or renew that leaves one on a permit is refused, naming
// spec.owner.
func TestGateOwnersAreTheManagers(t *testing.T) {
	const grace = time.Second
	gate := GateOwnerPrefix + "0000-victim"
	for _, c := range []struct {
		name   string
		caller Caller
		ok     bool
	}{{"anyone", Caller{}, false}, {"a pod", Caller{PodNamespace: "team-b", PodName: "job-x", PodUID: "u1"}, false}, {"the manager", Caller{Manager: true}, true}} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				switch {
				case c.ok && err != nil:
					t.Fatalf("%s refused: %v", what, err)
				case !c.ok && (err == nil || !strings.Contains(err.Error(), "spec.owner") || !strings.Contains(err.Error(), `"pod:"`)):
					t.Fatalf("%s: err = %v, want a refusal naming spec.owner and the prefix", what, err)
				}
			}
			_, err := Stamp(nil, lockObj(gate, 30), t0, grace, c.caller)
			check("create", err)
			old := stamped(t, lockObj("cron-7", 30), t0)
			obj := old.DeepCopy()
			obj.Spec.AcquireTime, obj.Spec.Owner = nil, gate
			_, err = Stamp(old, obj, t0.Add(40*time.Second), grace, c.caller)
			check("takeover", err)
			// A renew of a gated pod's permit (the manager's create).
			held := lockObj(gate, 30)
			if _, err := Stamp(nil, held, t0, grace, Caller{Manager: true}); err != nil {
				t.Fatal(err)
			}
			held.ResourceVersion = "100"
			obj = held.DeepCopy()
			obj.Spec.TTLSeconds = 1
			_, err = Stamp(held, obj, t0.Add(time.Second), grace, c.caller)
			check("renew", err)
		})
	}
}
