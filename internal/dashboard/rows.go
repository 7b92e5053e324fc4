package dashboard

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

// permitRow is one permit as the page shows it. Times are the API
// server's, as stamped on the permit; the page counts down to ExpireTime
// with the browser's clock.
type permitRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Lock      string `json:"lock"`
	Slot      int32  `json:"slot"`
	Limit     int32  `json:"limit"`
	Owner     string `json:"owner"`
	// HolderPod is namespace/name of the holder's pod, when it has one.
	HolderPod string `json:"holderPod,omitempty"`
	// Token is the permit's resourceVersion: the fencing token, and the
	// precondition of a release from this row.
	Token       string     `json:"token"`
	TTLSeconds  int64      `json:"ttlSeconds"`
	AcquireTime *time.Time `json:"acquireTime,omitempty"`
	RenewTime   *time.Time `json:"renewTime,omitempty"`
	ExpireTime  *time.Time `json:"expireTime,omitempty"`
	// Releasing marks a permit whose delete has begun.
	Releasing bool `json:"releasing,omitempty"`
}

func (p *permitRow) key() string { return p.Namespace + "/" + p.Name }

func micro(t *metav1.MicroTime) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func newPermitRow(p *locksv1alpha1.QueenLock) *permitRow {
	r := &permitRow{
		Namespace: p.Namespace, Name: p.Name, Lock: p.Spec.Lock, Slot: p.Spec.Slot, Limit: p.Spec.Limit,
		Owner: p.Spec.Owner, Token: p.ResourceVersion, TTLSeconds: p.Spec.TTLSeconds,
		AcquireTime: micro(p.Spec.AcquireTime), RenewTime: micro(p.Spec.RenewTime), ExpireTime: micro(p.Spec.ExpireTime),
		Releasing: p.DeletionTimestamp != nil,
	}
	if hp := p.Spec.HolderPod; hp != nil {
		ns := hp.Namespace
		if ns == "" {
			ns = p.Namespace // written before holderPod had a namespace
		}
		r.HolderPod = ns + "/" + hp.Name
	}
	return r
}

// waiterRow is one waiter in a lock's line: a gated pod (Kind "pod") or a
// waiting call of the route, a handle or the CLI (Kind "waiter").
type waiterRow struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Lock      string `json:"lock"`
	Limit     int    `json:"limit,omitempty"`
	// Owner is the owner the permit will be held by once it is let in.
	Owner string `json:"owner"`
	// Since is when it began to wait, as the API server saw it.
	Since time.Time `json:"since"`
	// Order breaks ties of Since: the line's own order after the time.
	Order string `json:"order"`
	// Note says why a waiter is not being served, when it is not.
	Note string `json:"note,omitempty"`
}

func (w *waiterRow) key() string { return w.Kind + ":" + w.Namespace + "/" + w.Name }

// newPodWaiter answers the waiter of a pod that waits at the gate, or nil
// for any other pod.
func newPodWaiter(p *corev1.Pod) *waiterRow {
	if !gatedpod.Labelled(p) || !gatedpod.Gated(p) {
		return nil
	}
	w := &waiterRow{
		Kind: "pod", Namespace: p.Namespace, Name: p.Name, Owner: gatedpod.Owner(p),
		Since: gatedpod.QueuedAtTime(p).UTC(), Order: string(p.UID),
	}
	ask, err := gatedpod.ParseAsk(p.Annotations)
	w.Lock, w.Limit = ask.Lock, ask.Limit
	switch {
	case err != nil:
		w.Lock = p.Annotations[gatedpod.LockAnnotation]
		w.Note = err.Error()
	case p.DeletionTimestamp != nil:
		w.Note = "being deleted: it leaves the line"
	case !gatedpod.OnlyOurGate(p):
		w.Note = "another scheduling gate holds it too: it is served once that one is gone"
	}
	return w
}

// newLineWaiter answers the row of a waiting call, or nil for a gated
// pod's waiter, which the pod's own row shows. Since is by the carrier's
// clock; Order is the waiter's place, the line's own order.
func newLineWaiter(w *locksv1alpha1.QueenLockWaiter) *waiterRow {
	if w.Spec.Pod != nil || w.DeletionTimestamp != nil {
		return nil
	}
	r := &waiterRow{
		Kind: "waiter", Namespace: w.Namespace, Name: w.Name, Lock: w.Spec.Lock, Limit: int(w.Spec.Limit),
		Owner: w.Spec.Owner, Since: w.CreationTimestamp.UTC(), Order: fmt.Sprintf("%020d", locks.LineKey(w)),
	}
	if w.Spec.Since != nil {
		r.Since = w.Spec.Since.UTC()
	}
	return r
}

// guardedRow is one object fenced by a lock (section 8 of the contract):
// its kind and name and the record the guard webhook keeps on it. Only
// metadata is ever read: never a Secret's data.
type guardedRow struct {
	Kind      string `json:"kind"` // ConfigMap or Secret
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Lock      string `json:"lock"`
	Slot      int    `json:"slot"`
	// Token is the highest token the object has accepted.
	Token string `json:"token"`
}

func (g *guardedRow) key() string { return g.Kind + ":" + g.Namespace + "/" + g.Name }

// newGuardedRow answers the row of an object bound to a lock, or nil when
// it is not guarded or not bound (no record yet, or one from before
// records named their lock).
func newGuardedRow(kind string, m *metav1.ObjectMeta) *guardedRow {
	if m.Labels[permit.GuardedLabel] != "true" {
		return nil
	}
	g, bound, err := permit.ParseFence(m.Annotations[permit.FenceAnnotation])
	if err != nil || !bound {
		return nil
	}
	return &guardedRow{Kind: kind, Namespace: m.Namespace, Name: m.Name, Lock: g.Lock, Slot: g.Slot,
		Token: strconv.FormatUint(g.Token, 10)}
}
