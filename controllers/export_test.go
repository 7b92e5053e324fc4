package controllers

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KeepFollowed saves the tracker queen_locks_holder_pods_followed reads, for
// a test that makes a tracker of its own (NewPods takes the gauge over), and
// answers a function that puts the saved one back.
func KeepFollowed() (restore func()) {
	saved := followedFrom.Load()
	return func() { followedFrom.Store(saved) }
}

// ListSlotHold sets how long a namespace whose first list fails keeps its
// slot, for the trackers made until the answered function puts the old
// bound back.
func ListSlotHold(d time.Duration) (restore func()) {
	saved := listSlotHold
	listSlotHold = d
	return func() { listSlotHold = saved }
}

// ListsAtOnce is how many namespaces may have their first list under way.
const ListsAtOnce = listsAtOnce

// Seen hands the tracker a watch event of a pod of ns, as the namespace's
// watch would, for a test of events the API server sends only in races.
func (t *Pods) Seen(ns string, m *metav1.PartialObjectMetadata, gone bool) {
	t.mu.Lock()
	sp := t.spaces[ns]
	t.mu.Unlock()
	if sp != nil {
		t.seen(sp, m, gone)
	}
}

// Reading tells whether a read of the pod on its own is under way.
func (t *Pods) Reading(ns, name, uid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.pods[podKey{ns, name, uid}]
	return f != nil && f.checking
}

// ReconcileLogs is the LogConstructor the controllers give controller-runtime.
var ReconcileLogs = reconcileLogs
