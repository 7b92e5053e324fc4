// Package chaos is the fault-injection safety check behind make chaos: client
// processes contend for a lock and a semaphore and write a guarded ConfigMap
// under the lock's token (some of them misbehaving) while manager replicas,
// kube-apiserver, etcd and the clients themselves are killed, paused, cut
// apart and given clocks that disagree; then the recorded history is checked.
//
// What is recorded comes from two sides that do not trust each other: each
// client logs every call it made with its own wall-clock times and what it
// was answered, and a watcher records every version of the permit and of the
// ConfigMap in the order etcd committed them. The checks in check.go compare
// the two.
package main

import (
	"fmt"
	"time"
)

// Kinds of client operation.
const (
	KindAcquire = "acquire"
	KindRenew   = "renew"
	KindRelease = "release"
	KindWrite   = "write" // a write (update or create) of the guarded ConfigMap
	// KindDelete is a delete of the guarded ConfigMap: admitted only while
	// its last write marked it deletable under a token still current.
	KindDelete = "delete"
	// KindRevoke is a delete of the lock's permit by somebody other than its
	// holder (kubectl delete, with foreground or orphan propagation): the
	// manual release. Owner and Token are the version it deleted.
	KindRevoke = "revoke"
)

// Roles of client processes: the holder plays by the rules; the others
// misbehave, and the checks must show none of their writes stored.
const (
	// RoleHolder acquires, writes under its token, renews, writes, releases.
	RoleHolder = "holder"
	// RoleUnguarded writes the guarded ConfigMap without a guard.
	RoleUnguarded = "unguarded"
	// RoleStale holds the lock, waits until it is replaced, then deletes,
	// marks deletable and re-creates the object under its stale token; while
	// it still holds the lock it sometimes deletes and re-creates the object
	// properly (mark deletable, delete, create).
	RoleStale = "stale"
	// RoleOtherLock holds a second lock and writes the object under that
	// lock's guard.
	RoleOtherLock = "other-lock"
	// RoleSemaphore contends for the semaphore: acquire, renew, release.
	RoleSemaphore = "semaphore"
	// RoleRevoker deletes the lock's permit with foreground or orphan
	// propagation, as kubectl delete --cascade=foreground|orphan does.
	RoleRevoker = "revoker"
	// RolePodGone is no client: Check makes a revoke of this role for each
	// delete of a permit whose holder pod the nemesis had deleted (the
	// expiry controller's doing, or a release that raced it).
	RolePodGone = "pod-gone"
)

// Roles lists the misbehaving roles, one client process each, after the
// holders.
var Roles = []string{RoleUnguarded, RoleStale, RoleOtherLock, RoleRevoker}

// Outcomes of a client operation.
const (
	Acquired  = "acquired"
	Already   = "already"
	Held      = "held"
	Contended = "contended"
	Renewed   = "renewed"
	Released  = "released"
	Lost      = "lost"
	Written   = "written"
	Deleted   = "deleted"
	// Refused is a guarded write the webhook denied (kv_precondition).
	Refused = "refused"
	// Failed was certainly not applied: the connection was refused, or the
	// API server's compare-and-swap failed. It is left out of the checks.
	Failed = "failed"
	// Unknown may or may not have been applied: a timeout, a reset
	// connection, a 5xx. The checks allow both.
	Unknown = "unknown"
)

// Op is one call a client made, as the client saw it. Times are Unix
// nanoseconds of the machine's wall clock, which the manager's webhook
// also stamps permits with: every process runs on this one machine.
type Op struct {
	Client  int    `json:"client"`
	Role    string `json:"role,omitempty"` // the client's role; empty is a holder
	Lock    string `json:"lock,omitempty"` // the lock, when not the run's main lock
	Kind    string `json:"kind"`
	Owner   string `json:"owner"`
	Token   uint64 `json:"token,omitempty"` // the token sent (renew, release, write)
	TTL     int64  `json:"ttl,omitempty"`   // seconds (acquire, renew)
	Limit   int    `json:"limit,omitempty"` // acquire of the semaphore
	Wait    int64  `json:"wait,omitempty"`  // acquire: waitSeconds sent
	Slot    int    `json:"slot,omitempty"`  // the slot sent (renew, release) or answered (acquire)
	Holders int    `json:"holders,omitempty"`
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
	Outcome string `json:"outcome"`

	// Acquire and renew: the token and expiry answered.
	NewToken  uint64 `json:"newToken,omitempty"`
	ExpiresAt int64  `json:"expiresAt,omitempty"`
	// A held acquire: the holder answered.
	HolderOwner   string `json:"holderOwner,omitempty"`
	HolderToken   uint64 `json:"holderToken,omitempty"`
	HolderExpires int64  `json:"holderExpires,omitempty"`
	// Waiting: how many waited in the lock's line, as the held answer
	// said. Such an acquire left the lock to the line.
	Waiting int `json:"waiting,omitempty"`
	// Write: the counter written and the ConfigMap's resourceVersion after.
	Counter int64  `json:"counter,omitempty"`
	Version uint64 `json:"version,omitempty"`
	// Write: the guard annotation sent ("" for none), whether the write
	// created the object and whether it marked it deletable.
	Guard     string `json:"guard,omitempty"`
	Create    bool   `json:"create,omitempty"`
	Deletable bool   `json:"deletable,omitempty"`
	// Revoke: the propagation policy of the delete.
	Propagation string `json:"propagation,omitempty"`

	Error string `json:"error,omitempty"`
	// Until: for an unknown operation that the record bounds (a release
	// whose owner's permit was later deleted), the latest moment it can
	// have taken effect. Set by the checks, not by clients.
	Until int64 `json:"until,omitempty"`
	// Denied: the route refused the caller's token or rights (401, 403).
	Denied bool `json:"denied,omitempty"`
	// BadCall: the route refused the call as malformed (a harness bug).
	BadCall bool `json:"badCall,omitempty"`
	// HungUp: an acquire sent without an owner (the route mints one) whose
	// caller hung up before the answer, on purpose (giveback.go). Check
	// fills in Owner with the minted owner the record shows it won.
	HungUp bool `json:"hungUp,omitempty"`
}

func (o Op) String() string {
	s := fmt.Sprintf("client %d %s owner=%s", o.Client, o.Kind, o.Owner)
	if o.Lock != "" {
		s += fmt.Sprintf(" lock=%s slot=%d", o.Lock, o.Slot)
	}
	if o.Token != 0 {
		s += fmt.Sprintf(" token=%d", o.Token)
	}
	if o.Wait != 0 {
		s += fmt.Sprintf(" wait=%ds", o.Wait)
	}
	s += " -> " + o.Outcome
	if o.NewToken != 0 {
		s += fmt.Sprintf(" token=%d expires=%s", o.NewToken, stamp(o.ExpiresAt))
	}
	if o.HolderOwner != "" {
		s += fmt.Sprintf(" holder=%s token=%d expires=%s", o.HolderOwner, o.HolderToken, stamp(o.HolderExpires))
	}
	if o.Kind == KindWrite {
		s += fmt.Sprintf(" guard=%q", o.Guard)
		if o.Create {
			s += " create"
		}
		if o.Deletable {
			s += " deletable"
		}
	}
	if o.Kind == KindWrite && o.Outcome == Written {
		s += fmt.Sprintf(" counter=%d version=%d", o.Counter, o.Version)
	}
	if o.Propagation != "" {
		s += " propagation=" + o.Propagation
	}
	s += fmt.Sprintf(" [%s .. %s]", stamp(o.Call), stamp(o.Return))
	if o.Error != "" {
		s += ": " + o.Error
	}
	return s
}

// Event is one version of the permit or of the ConfigMap, as a watch
// delivered it. Versions are etcd revisions: one total order over both.
type Event struct {
	Type    string `json:"type"` // ADDED, MODIFIED or DELETED
	Version uint64 `json:"version"`
	Seen    int64  `json:"seen"` // when the watcher received it

	// Permit fields (a DELETED event carries the last state).
	// Deleting: the permit has a deletionTimestamp (a foreground or orphan
	// delete waits for its finalizers to go): it is released, not held.
	Deleting    bool   `json:"deleting,omitempty"`
	Slot        int    `json:"slot,omitempty"`
	UID         string `json:"uid,omitempty"`
	Owner       string `json:"owner,omitempty"`
	AcquireTime int64  `json:"acquireTime,omitempty"`
	RenewTime   int64  `json:"renewTime,omitempty"`
	ExpireTime  int64  `json:"expireTime,omitempty"`
	HolderPod   string `json:"holderPod,omitempty"` // the UID of spec.holderPod

	// ConfigMap fields: what the writer put in, and the record the webhook
	// kept: the lock and slot of the fence, its token, and the deletable
	// mark (the token it was made under, as the webhook stores it).
	Counter   int64  `json:"counter,omitempty"`
	Token     uint64 `json:"token,omitempty"`
	Writer    string `json:"writer,omitempty"`
	Fence     uint64 `json:"fence,omitempty"`
	FenceLock string `json:"fenceLock,omitempty"` // "<lock>#<slot>"
	Deletable string `json:"deletable,omitempty"`
	Guarded   bool   `json:"guarded,omitempty"` // still carries the opt-in label
}

func (e Event) String() string {
	if e.Writer != "" || e.Counter != 0 || e.FenceLock != "" {
		return fmt.Sprintf("%s version=%d counter=%d token=%d writer=%s fence=%s=%d deletable=%q", e.Type, e.Version, e.Counter, e.Token, e.Writer, e.FenceLock, e.Fence, e.Deletable)
	}
	s := fmt.Sprintf("%s version=%d owner=%s acquired=%s renewed=%s expires=%s", e.Type, e.Version, e.Owner,
		stamp(e.AcquireTime), stamp(e.RenewTime), stamp(e.ExpireTime))
	if e.Deleting {
		s += " deleting"
	}
	return s
}

// History is everything one run recorded.
type History struct {
	// Grace is the manager's skew grace (--expiry-grace), Skew the largest
	// offset of a manager replica's clock from the machine's, both in ns:
	// the checks allow what they allow, and no more.
	Grace int64 `json:"grace,omitempty"`
	Skew  int64 `json:"skew,omitempty"`
	// Outages are the spans, [from, to] in Unix ns, from a kill of
	// kube-apiserver or etcd until the API server was ready again, and
	// while a replica's webhook was cut off from the API server: writes
	// then fail or hang, the manager's own (finishing a delete) too.
	Outages [][2]int64 `json:"outages,omitempty"`
	// PodsGone are the holder clients' pods the nemesis deleted.
	PodsGone []PodGone `json:"podsGone,omitempty"`
	Ops      []Op      `json:"ops"`
	Permits  []Event   `json:"permits"` // the lock's one permit, in commit order
	// SemPermits are the semaphore's permits, every slot, in commit order.
	SemPermits []Event `json:"semPermits,omitempty"`
	Objects    []Event `json:"objects"` // the guarded ConfigMap, in commit order
	// LeaderPermits and LeaderObjects are the fenced leaders' permit and
	// ConfigMap (leader.go), in commit order.
	LeaderPermits []Event `json:"leaderPermits,omitempty"`
	LeaderObjects []Event `json:"leaderObjects,omitempty"`
	// Holds are the gated pods' holds, as their clients saw them.
	Holds []Hold `json:"holds,omitempty"`
	// Waiters are the QueenLockWaiters of the run's namespace (the line of
	// every lock), in commit order: line_check.go.
	Waiters []WaiterEvent `json:"waiters,omitempty"`
	// Pods are the gated pods, as their clients' watches saw them: when
	// they were queued, told they cannot be let in, and gone.
	Pods []PodInfo `json:"pods,omitempty"`
	// Leases are the versions of the manager's leader election Lease:
	// when a leader ran (it renews every RetryPeriod).
	Leases []LeaseEvent `json:"leases,omitempty"`
}

// WaiterEvent is one version of a QueenLockWaiter, as the watch delivered
// it. The waiter's place in its lock's line is the version of its ADDED
// event (its create's resourceVersion).
type WaiterEvent struct {
	Type     string `json:"type"`
	Version  uint64 `json:"version"`
	Seen     int64  `json:"seen"`
	UID      string `json:"uid"`
	Lock     string `json:"lock"`
	Owner    string `json:"owner"`
	Limit    int    `json:"limit"`
	Position uint64 `json:"position,omitempty"` // spec.position, once the carrier recorded it
	Pod      string `json:"pod,omitempty"`      // the UID of spec.pod: a gated pod's waiter
}

// PodInfo is what a gated client's watch saw of one of its pods.
type PodInfo struct {
	UID   string `json:"uid"`
	Name  string `json:"name,omitempty"`
	Lock  string `json:"lock,omitempty"`
	Limit int    `json:"limit,omitempty"`
	Shape string `json:"shape,omitempty"`
	// QueuedAt is the pod's locks.queen.dev/queued-at, the pod webhook's
	// stamp (by the clock of the replica that admitted it).
	QueuedAt int64 `json:"queuedAt,omitempty"`
	// NotAdmitted is when the watch first showed the pod's condition
	// locks.queen.dev/Admitted False (the manager could not let it in and
	// said why, in Reason); 0 if never.
	NotAdmitted int64  `json:"notAdmitted,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Gone is when the watch first showed the pod deleted (or being
	// deleted); 0 if never.
	Gone int64 `json:"gone,omitempty"`
}

// LeaseEvent is one version of the manager's leader election Lease.
type LeaseEvent struct {
	Version uint64 `json:"version"`
	Seen    int64  `json:"seen"`
	Holder  string `json:"holder"`
}

func stamp(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format("15:04:05.000000")
}

// PodGone is a holder client's pod deleted by the nemesis.
type PodGone struct {
	Client int    `json:"client"`
	UID    string `json:"uid"`
	Call   int64  `json:"call"` // when the delete was sent
}
