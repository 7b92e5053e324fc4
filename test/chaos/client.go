package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// Client is one contender: it loops acquire, guarded write, renew, guarded
// write, release, and logs every call as an Op.
type Client struct {
	ID        int
	Route     handle.Transport // the route, namespace set
	Namespace string
	Lock      string
	Object    string // the guarded ConfigMap
	TTL       int64  // seconds
	// Kube writes the ConfigMap and (the revoker) deletes permits, as an
	// ordinary namespace user: never one with the guard's override right.
	Kube    kubernetes.Interface
	Permits client.Client
	// REST is the API server's config as the client's user (RoleLeader's
	// election lock).
	REST *rest.Config
	Rand *rand.Rand
	Log  func(Op)
	// LogHold records a gated pod's hold (RoleGated).
	LogHold func(Hold)
	// LogPod records what a gated client saw of one of its pods.
	LogPod func(PodInfo)
	// Role is one of the Role constants; empty is RoleHolder.
	Role string
	// OtherLock is the second lock whose guard RoleOtherLock writes under.
	OtherLock string

	cycle int
}

// Run loops until stop is closed, finishing the call in hand.
func (c *Client) Run(ctx context.Context, stop <-chan struct{}) {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	switch c.Role {
	case RoleUnguarded:
		c.runUnguarded(ctx, stopped)
		return
	case RoleStale:
		c.runStale(ctx, stop, stopped)
		return
	case RoleOtherLock:
		c.runOtherLock(ctx, stop, stopped)
		return
	case RoleRevoker:
		c.runRevoker(ctx, stopped)
		return
	case RoleSemaphore:
		c.runSemaphore(ctx, stop, stopped)
		return
	case RoleGated:
		c.runGated(ctx, stopped)
		return
	case RoleLeader:
		c.runLeader(ctx, stopped)
		return
	}
	for !stopped() {
		c.cycle++
		owner := ownerName(c.ID, c.cycle)
		token, ok := c.acquire(ctx, owner, stop)
		if !ok {
			c.pause(50, 250)
			continue
		}
		c.pause(0, 300)
		c.write(ctx, owner, token)
		c.pause(0, 300)
		op := c.call(ctx, Op{Kind: KindRenew, Owner: owner, Token: token, TTL: c.TTL})
		if op.Outcome != Renewed {
			continue // lost, or not known: a new cycle with a new owner
		}
		token = op.NewToken
		c.pause(0, 300)
		c.write(ctx, owner, token)
		if c.Rand.IntN(8) == 0 {
			continue // walk away without releasing: the lease must run out
		}
		c.call(ctx, Op{Kind: KindRelease, Owner: owner, Token: token})
	}
}

// acquire tries once, and again with the same owner while the answer is
// unknown (a retry answers "already" if the first one won).
func (c *Client) acquire(ctx context.Context, owner string, stop <-chan struct{}) (uint64, bool) {
	op, ok := c.acquireOp(ctx, "", owner, stop)
	return op.NewToken, ok
}

// acquireOp is acquire on lock ("" is c.Lock), answering the winning op.
func (c *Client) acquireOp(ctx context.Context, lock, owner string, stop <-chan struct{}) (Op, bool) {
	for {
		op := c.call(ctx, Op{Lock: lock, Kind: KindAcquire, Owner: owner, TTL: c.TTL, Wait: c.wait()})
		switch op.Outcome {
		case Acquired, Already:
			return op, true
		case Unknown, Failed:
			select {
			case <-stop:
				return op, false
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return op, false
		}
	}
}

// wait is the waitSeconds of an acquire: half the time none (answer at
// once), else 1 to 3 s, so that the history holds waiters woken by a
// release, an expiry or a revoke, and waits that time out.
func (c *Client) wait() int64 {
	if c.Rand.IntN(2) == 0 {
		return 0
	}
	return 1 + c.Rand.Int64N(3)
}

func (c *Client) pause(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+c.Rand.IntN(maxMS-minMS+1)) * time.Millisecond)
}

// call makes one lock operation through the route and logs it.
func (c *Client) call(ctx context.Context, op Op) Op {
	op.Client, op.Role = c.ID, c.Role
	op.Call = time.Now().UnixNano()
	err := c.send(ctx, &op)
	op.Return = time.Now().UnixNano()
	var refused *handle.CallError
	switch {
	case errors.As(err, &refused) && (refused.Code == http.StatusUnauthorized || refused.Code == http.StatusForbidden):
		// Refused by the route's TokenReview or SubjectAccessReview:
		// nothing was applied (every 4xx applies nothing), but the harness's
		// token and rights are good, so the review itself said no.
		op.Outcome, op.Error, op.Denied = Failed, err.Error(), true
	case errors.As(err, &refused) && refused.Code >= 400 && refused.Code < 500:
		// The route refused the call whole: nothing was applied, and the
		// harness sent something wrong.
		op.Outcome, op.Error, op.BadCall = Failed, err.Error(), true
	case errors.Is(err, syscall.ECONNREFUSED):
		op.Outcome, op.Error = Failed, err.Error() // the manager is down: nothing was sent
	case err != nil:
		op.Outcome, op.Error = Unknown, err.Error()
	}
	c.Log(op)
	return op
}

// send makes op's call through the handle's route transport, the one
// programs use, and records the answer in op.
func (c *Client) send(ctx context.Context, op *Op) error {
	lock := c.Lock
	if op.Lock != "" {
		lock = op.Lock
	}
	switch op.Kind {
	case KindAcquire:
		var a locks.Acquired
		var err error
		if wt, ok := c.Route.(handle.WaitingTransport); ok && op.Wait > 0 {
			a, _, err = wt.AcquireWaiting(ctx, lock, op.Owner, op.TTL, max(op.Limit, 1), time.Duration(op.Wait)*time.Second)
		} else {
			a, err = c.Route.Acquire(ctx, lock, op.Owner, op.TTL, max(op.Limit, 1))
		}
		switch {
		case err != nil:
			return err
		case a.Already:
			op.Outcome = Already
		case a.Acquired:
			op.Outcome = Acquired
		case a.Reason == locks.ReasonHeld:
			op.Outcome = Held
			op.Waiting = a.Waiting
			if len(a.Holders) > 0 {
				h := a.Holders[0]
				op.HolderOwner, op.HolderToken, op.HolderExpires = h.Owner, h.Token, h.ExpiresAt.UnixNano()
			}
		case a.Reason == locks.ReasonContended:
			op.Outcome = Contended
		default:
			return fmt.Errorf("unexpected answer %+v", a)
		}
		if a.Acquired {
			op.NewToken, op.ExpiresAt, op.Slot = a.Permit.Token, a.Permit.ExpiresAt.UnixNano(), a.Permit.Slot
		}
		op.Holders = len(a.Holders)
	case KindRenew:
		r, err := c.Route.Renew(ctx, lock, op.Slot, op.Token, op.Owner, op.TTL)
		switch {
		case err != nil:
			return err
		case r.Renewed:
			op.Outcome, op.NewToken, op.ExpiresAt = Renewed, r.Permit.Token, r.Permit.ExpiresAt.UnixNano()
		case r.Reason == locks.ReasonLost:
			op.Outcome = Lost
		default:
			return fmt.Errorf("unexpected answer %+v", r)
		}
	case KindRelease:
		released, err := c.Route.Release(ctx, lock, op.Slot, op.Token, op.Owner)
		if err != nil {
			return err
		}
		op.Outcome = Lost
		if released {
			op.Outcome = Released
		}
	default:
		return fmt.Errorf("no lock operation %q", op.Kind)
	}
	return nil
}

// write bumps the ConfigMap's counter under the guard of token: read,
// then update with the read's resourceVersion, again on a plain conflict;
// a missing ConfigMap (deleted by a holder) is created.
func (c *Client) write(ctx context.Context, owner string, token uint64) {
	g := permit.Guard{Lock: c.Lock, Slot: 0, Token: token}
	c.writeWith(ctx, writeSpec{owner: owner, guard: &g})
}

// writeSpec is one kind of write of the ConfigMap.
type writeSpec struct {
	owner     string
	guard     *permit.Guard // nil sends none
	deletable bool          // mark the object deletable under the guard
	patch     bool          // a merge patch of the read version instead of an update
	// noCreate leaves a missing object missing. The first guarded write
	// of a new object binds it to whichever lock its guard names: a holder
	// of another lock may create it, and then it is that lock's.
	noCreate bool
	// stale, when set, is the content written (by a create): a replaced
	// holder's old counter and token.
	stale map[string]string
}

func (c *Client) writeWith(ctx context.Context, w writeSpec) {
	for try := 0; try < 3; try++ {
		cm, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Object, metav1.GetOptions{})
		create := apierrors.IsNotFound(err)
		if err != nil && !create || create && w.noCreate {
			return // nothing sent
		}
		var n int64
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: c.Object, Namespace: c.Namespace,
				Labels: map[string]string{permit.GuardedLabel: "true"}}}
		} else {
			n, _ = strconv.ParseInt(cm.Data["counter"], 10, 64)
		}
		n++
		var token uint64
		if w.guard != nil {
			token = w.guard.Token
		}
		cm.Data = map[string]string{"counter": strconv.FormatInt(n, 10), "token": strconv.FormatUint(token, 10), "writer": w.owner}
		if w.stale != nil {
			cm.Data = w.stale
			n, _ = strconv.ParseInt(w.stale["counter"], 10, 64)
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		delete(cm.Annotations, permit.GuardAnnotation)
		op := Op{Client: c.ID, Role: c.Role, Kind: KindWrite, Owner: w.owner, Token: token, Counter: n, Create: create, Deletable: w.deletable}
		if w.guard != nil {
			op.Guard = w.guard.String()
			cm.Annotations[permit.GuardAnnotation] = op.Guard
			if w.guard.Lock != c.Lock {
				op.Lock = w.guard.Lock
			}
		}
		if w.deletable {
			cm.Annotations[permit.DeletableAnnotation] = "true"
		}
		op.Call = time.Now().UnixNano()
		var got *corev1.ConfigMap
		switch {
		case create:
			got, err = c.Kube.CoreV1().ConfigMaps(c.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		case w.patch:
			body, _ := json.Marshal(map[string]any{
				"metadata": map[string]any{"resourceVersion": cm.ResourceVersion, "annotations": cm.Annotations},
				"data":     cm.Data})
			got, err = c.Kube.CoreV1().ConfigMaps(c.Namespace).Patch(ctx, c.Object, types.MergePatchType, body, metav1.PatchOptions{})
		default:
			got, err = c.Kube.CoreV1().ConfigMaps(c.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		}
		op.Return = time.Now().UnixNano()
		switch err {
		case nil:
			op.Outcome = Written
			op.Version, _ = permit.Token(got.ResourceVersion)
		default:
			op.Outcome, op.Error = writeOutcome(err), err.Error()
		}
		c.Log(op)
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) || op.Outcome == Refused || w.stale != nil {
			return
		}
	}
}

// writeOutcome sorts the error of a write or delete of the ConfigMap.
func writeOutcome(err error) string {
	switch {
	case strings.Contains(err.Error(), "kv_precondition"):
		return Refused
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) ||
		strings.Contains(err.Error(), "failed calling webhook"):
		// The compare-and-swap failed, the name was taken or gone, or
		// admission could not run: nothing was stored.
		return Failed
	}
	return Unknown
}

// deleteObject deletes the ConfigMap, believing it holds token.
func (c *Client) deleteObject(ctx context.Context, owner string, token uint64) Op {
	op := Op{Client: c.ID, Role: c.Role, Kind: KindDelete, Owner: owner, Token: token, Call: time.Now().UnixNano()}
	err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Delete(ctx, c.Object, metav1.DeleteOptions{})
	op.Return = time.Now().UnixNano()
	op.Outcome = Deleted
	if err != nil {
		op.Outcome, op.Error = writeOutcome(err), err.Error()
	}
	c.Log(op)
	return op
}

// runUnguarded writes the ConfigMap without a guard, by update or merge
// patch: every write must be refused.
func (c *Client) runUnguarded(ctx context.Context, stopped func() bool) {
	for i := 0; !stopped(); i++ {
		c.pause(200, 700)
		c.writeWith(ctx, writeSpec{owner: fmt.Sprintf("u%d.%d", c.ID, i), patch: i%2 == 1})
	}
}

// runStale acquires the lock and writes under it like a holder; a third of
// the time it then deletes and re-creates the object properly while it
// still holds the lock. Then it walks away, waits until its lease has ended
// (and, often, a new holder has taken over and written), and tries with its
// stale token what a replaced holder might: write, mark the object
// deletable, delete it, and create it again with its old content. None of
// that may be stored.
func (c *Client) runStale(ctx context.Context, stop <-chan struct{}, stopped func() bool) {
	for !stopped() {
		c.cycle++
		owner := ownerName(c.ID, c.cycle)
		acq, ok := c.acquireOp(ctx, "", owner, stop)
		if !ok {
			c.pause(50, 250)
			continue
		}
		token := acq.NewToken
		g := permit.Guard{Lock: c.Lock, Token: token}
		c.pause(0, 200)
		c.write(ctx, owner, token)
		cm, _ := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Object, metav1.GetOptions{})
		var content map[string]string
		if cm != nil && cm.Data["writer"] == owner {
			content = cm.Data
		}
		if c.Rand.IntN(3) == 0 {
			// The documented way to delete a guarded object, then create it
			// again: all under a current token.
			c.writeWith(ctx, writeSpec{owner: owner, guard: &g, deletable: true})
			if c.deleteObject(ctx, owner, token).Outcome == Deleted {
				c.write(ctx, owner, token)
			}
		}
		// Replaced: past the lease's end, by up to twice the TTL.
		wake := time.Unix(0, acq.ExpiresAt).Add(time.Duration(c.Rand.Int64N(2*c.TTL*int64(time.Second)) + 1))
		select {
		case <-stop:
			return
		case <-time.After(time.Until(wake)):
		}
		for _, i := range c.Rand.Perm(4) {
			switch i {
			case 0:
				c.writeWith(ctx, writeSpec{owner: owner, guard: &g})
			case 1:
				c.writeWith(ctx, writeSpec{owner: owner, guard: &g, deletable: true})
			case 2:
				c.deleteObject(ctx, owner, token)
			case 3:
				if content != nil {
					c.writeWith(ctx, writeSpec{owner: owner, guard: &g, stale: content})
				}
			}
		}
		c.pause(100, 500)
	}
}

// runOtherLock holds a second lock and writes the ConfigMap under that
// lock's guard, which holds now but is not the lock the object is bound to.
func (c *Client) runOtherLock(ctx context.Context, stop <-chan struct{}, stopped func() bool) {
	for !stopped() {
		c.cycle++
		owner := fmt.Sprintf("o%d.%d", c.ID, c.cycle)
		acq, ok := c.acquireOp(ctx, c.OtherLock, owner, stop)
		if !ok {
			c.pause(200, 500)
			continue
		}
		token := acq.NewToken
		for i := 0; i < 3 && !stopped(); i++ {
			c.pause(100, 400)
			g := permit.Guard{Lock: c.OtherLock, Token: token}
			c.writeWith(ctx, writeSpec{owner: owner, guard: &g, deletable: i == 2, noCreate: true})
			r := c.call(ctx, Op{Lock: c.OtherLock, Kind: KindRenew, Owner: owner, Token: token, TTL: c.TTL})
			if r.Outcome != Renewed {
				break
			}
			token = r.NewToken
		}
		c.call(ctx, Op{Lock: c.OtherLock, Kind: KindRelease, Owner: owner, Token: token})
	}
}

// runRevoker deletes the lock's permit now and then, as a person with
// kubectl would: mostly with foreground propagation, sometimes orphan,
// sometimes a plain (background) delete. Each is conditional on the version
// it read, so that the history says which lease it ended.
func (c *Client) runRevoker(ctx context.Context, stopped func() bool) {
	policies := []metav1.DeletionPropagation{metav1.DeletePropagationForeground, metav1.DeletePropagationForeground,
		metav1.DeletePropagationOrphan, metav1.DeletePropagationBackground}
	for !stopped() {
		c.pause(3000, 9000)
		var p locksv1alpha1.QueenLock
		if err := c.Permits.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: permit.Name(c.Lock, 0)}, &p); err != nil || p.DeletionTimestamp != nil {
			continue
		}
		token, err := permit.Token(p.ResourceVersion)
		if err != nil {
			continue
		}
		policy := policies[c.Rand.IntN(len(policies))]
		op := Op{Client: c.ID, Role: c.Role, Kind: KindRevoke, Owner: p.Spec.Owner, Token: token, Propagation: string(policy), Call: time.Now().UnixNano()}
		rv := p.ResourceVersion
		err = c.Permits.Delete(ctx, &p, client.Preconditions{UID: &p.UID, ResourceVersion: &rv}, client.PropagationPolicy(policy))
		op.Return = time.Now().UnixNano()
		switch {
		case err == nil:
			op.Outcome = Released
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			op.Outcome, op.Error = Lost, err.Error()
		case errors.Is(err, syscall.ECONNREFUSED):
			op.Outcome, op.Error = Failed, err.Error()
		default:
			op.Outcome, op.Error = Unknown, err.Error()
		}
		c.Log(op)
	}
}

// runSemaphore contends for the semaphore (SemaphoreLimit slots) with the
// other semaphore clients: acquire, pause, renew, pause, release, or one
// time in eight walk away and let the lease run out.
func (c *Client) runSemaphore(ctx context.Context, stop <-chan struct{}, stopped func() bool) {
	for !stopped() {
		c.cycle++
		if c.Rand.IntN(hangUpShare) == 0 {
			c.hangUp(ctx, Semaphore, SemaphoreLimit)
			c.pause(50, 250)
			continue
		}
		owner := fmt.Sprintf("s%d.%d", c.ID, c.cycle)
		var acq Op
		for {
			acq = c.call(ctx, Op{Lock: Semaphore, Limit: SemaphoreLimit, Kind: KindAcquire, Owner: owner, TTL: c.TTL, Wait: c.wait()})
			if acq.Outcome != Unknown && acq.Outcome != Failed {
				break
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		if acq.Outcome != Acquired && acq.Outcome != Already {
			c.pause(50, 250)
			continue
		}
		c.pause(0, 600)
		r := c.call(ctx, Op{Lock: Semaphore, Slot: acq.Slot, Kind: KindRenew, Owner: owner, Token: acq.NewToken, TTL: c.TTL})
		if r.Outcome != Renewed {
			continue
		}
		c.pause(0, 600)
		if c.Rand.IntN(8) == 0 {
			continue
		}
		c.call(ctx, Op{Lock: Semaphore, Slot: acq.Slot, Kind: KindRelease, Owner: owner, Token: r.NewToken})
	}
}

// hangUpShare: one semaphore cycle in hangUpShare is a hang-up instead.
const hangUpShare = 5

// hangUpAfter is how long a hang-up waits for its answer: the hold keeps
// a minted owner's permit write at least HoldMintedMin, so the route's
// acquire of a free slot wins after the caller left.
const hangUpAfter = 200 * time.Millisecond

// hangUp sends an acquire without an owner and hangs up before its answer
// (issue 41): the route mints the owner, and when its acquire wins after
// the caller left, it must give the permit back at the version it made,
// since nobody can learn the owner to release it. giveback.go matches the
// record to these calls.
func (c *Client) hangUp(ctx context.Context, lock string, limit int) {
	op := Op{Client: c.ID, Role: c.Role, Lock: lock, Kind: KindAcquire, TTL: c.TTL, Limit: limit, HungUp: true, Call: time.Now().UnixNano()}
	hctx, cancel := context.WithTimeout(ctx, hangUpAfter)
	a, err := c.Route.Acquire(hctx, lock, "", c.TTL, limit)
	cancel()
	op.Return = time.Now().UnixNano()
	switch {
	case err != nil:
		op.Outcome, op.Error = Unknown, err.Error()
		var refused *handle.CallError
		if errors.As(err, &refused) || errors.Is(err, syscall.ECONNREFUSED) {
			op.Outcome, op.HungUp = Failed, false // answered, or never sent: no hang-up
		}
	case a.Acquired:
		// Answered in time after all: the caller has the permit, and
		// releases it as any holder would.
		op.Outcome, op.Owner, op.NewToken, op.ExpiresAt, op.Slot = Acquired, a.Permit.Owner, a.Permit.Token, a.Permit.ExpiresAt.UnixNano(), a.Permit.Slot
		op.HungUp = false
	case a.Reason == locks.ReasonHeld:
		op.Outcome, op.HungUp = Held, false
	default:
		op.Outcome, op.HungUp = Contended, false
	}
	c.Log(op)
	if op.Outcome == Acquired {
		c.call(ctx, Op{Lock: lock, Slot: op.Slot, Kind: KindRelease, Owner: op.Owner, Token: op.NewToken})
	}
}
