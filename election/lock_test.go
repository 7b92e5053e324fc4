package election_test

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/queen-locks/queen-locks/election"
	"github.com/queen-locks/queen-locks/permit"
)

// The cases of client-go's TestTryAcquireOrRenew that apply to a lock of
// one's own, each run with client-go's LeaderElector against a QueenLock
// permit on the real API server.

// Acquire with no object: the candidate creates the permit.
func TestAcquireWithNoObject(t *testing.T) {
	ns := env.Namespace(t, "election")
	lock := newLock(t, ns, "ctrl", "a")
	e := run(t, lock, false)
	await(t, "a to lead", e.started)
	p := getPermit(t, ns, "ctrl")
	if p == nil || p.Spec.Owner != "a" || p.Spec.TTLSeconds != 2 || p.Spec.Slot != 0 || p.Spec.Limit != 1 || p.Spec.LeaderTransitions != 0 {
		t.Fatalf("permit %+v, want held by a for 2 s with no transitions", p)
	}
	if p.Spec.AcquireTime == nil || p.Spec.RenewTime == nil || p.Spec.ExpireTime == nil {
		t.Fatalf("permit %+v: the server did not stamp its times", p.Spec)
	}
	// The record is the permit's, times as the server stamped them.
	rec, _, err := newLock(t, ns, "ctrl", "reader").Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rec.HolderIdentity != "a" || rec.LeaseDurationSeconds != 2 || rec.LeaderTransitions != 0 {
		t.Fatalf("record %+v", rec)
	}
	if tok := lock.Token(); tok == 0 {
		t.Fatal("the leader has no token")
	}
}

// Acquire an unheld one: a permit that its leader released is free at
// once (client-go's release deletes it), and the candidate that watched it
// carries the count of transitions on.
func TestAcquireUnheldAfterRelease(t *testing.T) {
	ns := env.Namespace(t, "election")
	a := run(t, newLock(t, ns, "ctrl", "a"), true)
	await(t, "a to lead", a.started)
	bLock := &counting{Interface: newLock(t, ns, "ctrl", "b")}
	b := run(t, bLock, false)
	eventually(t, "b to read a's permit", func() bool { return bLock.Gets() >= 2 })
	a.stop() // ReleaseOnCancel
	await(t, "b to lead", b.started)
	p := getPermit(t, ns, "ctrl")
	if p == nil || p.Spec.Owner != "b" || p.Spec.LeaderTransitions != 1 {
		t.Fatalf("permit %+v, want held by b after one transition", p)
	}
}

// Do not acquire a held and live one: the candidate keeps reading and
// never writes.
func TestDoNotAcquireAHeldAndLiveOne(t *testing.T) {
	ns := env.Namespace(t, "election")
	held := holdAs(t, ns, "ctrl", "other", 3600)
	lock := &counting{Interface: newLock(t, ns, "ctrl", "b")}
	e := run(t, lock, false)
	eventually(t, "several tries of b", func() bool { return lock.Gets() >= 4 })
	select {
	case <-e.started:
		t.Fatal("b leads while other's permit is live")
	default:
	}
	if p := getPermit(t, ns, "ctrl"); p.ResourceVersion != held.ResourceVersion {
		t.Fatalf("the permit was written: %+v", p.Spec)
	}
}

// A takeover while the server's lease is live is refused by the webhook,
// whatever the candidate believes: here it believes the lease expired and
// sends the takeover client-go would.
func TestTakeoverOfALiveLeaseIsRefused(t *testing.T) {
	ns := env.Namespace(t, "election")
	held := holdAs(t, ns, "ctrl", "other", 3600)
	lock := newLock(t, ns, "ctrl", "b")
	ctx := context.Background()
	old, _, err := lock.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = lock.Update(ctx, resourcelock.LeaderElectionRecord{
		HolderIdentity: "b", LeaseDurationSeconds: 2, LeaderTransitions: old.LeaderTransitions + 1,
	})
	if apierrors.ReasonForError(err) != permit.ReasonHeld {
		t.Fatalf("takeover of a live lease: %v, want refused as held", err)
	}
	if p := getPermit(t, ns, "ctrl"); p.ResourceVersion != held.ResourceVersion || p.Spec.Owner != "other" {
		t.Fatalf("the permit was written: %+v", p.Spec)
	}
	if lock.Token() != 0 {
		t.Fatal("a refused candidate has a token")
	}
	if lock.Lost() != nil {
		t.Fatalf("a candidate that never led lost: %v", lock.Lost())
	}
}

// Acquire an expired one: the permit of a holder that stopped renewing is
// taken over once the server says it expired, with one more transition.
func TestAcquireAnExpiredOne(t *testing.T) {
	ns := env.Namespace(t, "election")
	held := holdAs(t, ns, "ctrl", "other", 1)
	e := run(t, newLock(t, ns, "ctrl", "b"), false)
	await(t, "b to lead", e.started)
	p := getPermit(t, ns, "ctrl")
	if p.Spec.Owner != "b" || p.Spec.LeaderTransitions != 1 || p.Spec.AcquireTime.Equal(held.Spec.AcquireTime) {
		t.Fatalf("permit %+v, want taken over by b with a new acquireTime and one transition", p.Spec)
	}
	if !p.Spec.AcquireTime.Time.After(held.Spec.ExpireTime.Time) {
		t.Fatalf("taken over at %v, before the server's expiry %v", p.Spec.AcquireTime, held.Spec.ExpireTime)
	}
}

// Renew one's own: every renew keeps the holding (owner, acquireTime,
// transitions) and answers a new token.
func TestRenewOwn(t *testing.T) {
	ns := env.Namespace(t, "election")
	lock := newLock(t, ns, "ctrl", "a")
	e := run(t, lock, false)
	await(t, "a to lead", e.started)
	first := getPermit(t, ns, "ctrl")
	seen := map[uint64]bool{lock.Token(): true}
	eventually(t, "three renews", func() bool {
		seen[lock.Token()] = true
		return len(seen) >= 4
	})
	p := getPermit(t, ns, "ctrl")
	if p.Spec.Owner != "a" || !p.Spec.AcquireTime.Equal(first.Spec.AcquireTime) || p.Spec.LeaderTransitions != 0 ||
		!p.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Fatalf("after renews %+v, first %+v", p.Spec, first.Spec)
	}
	tok, _ := permit.Token(p.ResourceVersion)
	if tok < lock.Token() {
		t.Fatalf("the lock's token %d is ahead of the permit's %d", lock.Token(), tok)
	}
}

// Release on cancel: the leader deletes its permit, and holds no token.
func TestReleaseOnCancel(t *testing.T) {
	ns := env.Namespace(t, "election")
	lock := newLock(t, ns, "ctrl", "a")
	e := run(t, lock, true)
	await(t, "a to lead", e.started)
	e.stop()
	await(t, "OnStoppedLeading", e.stopped)
	if p := getPermit(t, ns, "ctrl"); p != nil {
		t.Fatalf("the permit outlived the release: %+v", p.Spec)
	}
	if lock.Token() != 0 || lock.Lost() != nil {
		t.Fatalf("after the release: token %d, lost %v", lock.Token(), lock.Lost())
	}
}

// Transitions after a takeover: each new holder counts one more; the
// leader that was replaced learns it at its next renew, for good.
func TestTransitionsAfterTakeovers(t *testing.T) {
	ns := env.Namespace(t, "election")
	for i, id := range []string{"a", "b", "c"} {
		lock := newLock(t, ns, "ctrl", id)
		e := run(t, lock, false)
		await(t, id+" to lead", e.started)
		p := getPermit(t, ns, "ctrl")
		if p.Spec.Owner != id || p.Spec.LeaderTransitions != int32(i) {
			t.Fatalf("permit %+v, want held by %s after %d transitions", p.Spec, id, i)
		}
		e.stop() // no release: the next one waits out the lease
		if i > 0 {
			continue
		}
		// a learns at its next read that it was replaced, and stays lost.
		defer func() {
			if _, _, err := lock.Get(context.Background()); !errors.Is(err, election.ErrLost) {
				t.Errorf("a's Get after the takeovers: %v, want ErrLost", err)
			}
			err := lock.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 2})
			if !errors.Is(err, election.ErrLost) {
				t.Errorf("a's renew after the takeovers: %v, want ErrLost", err)
			}
			if lock.Token() != 0 {
				t.Errorf("a lost, with token %d", lock.Token())
			}
		}()
	}
}
