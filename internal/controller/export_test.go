package controller

import "time"

// KeepFollowed saves the tracker queen_locks_holder_pods_followed reads, for
// a test that makes a tracker of its own (NewPods takes the gauge over), and
// answers a function that puts the saved one back.
func KeepFollowed() (restore func()) {
	saved := followedFrom.Load()
	return func() { followedFrom.Store(saved) }
}

// ListSlotHold sets how long a namespace whose first list fails keeps its
// slot, and answers a function that puts the old bound back.
func ListSlotHold(d time.Duration) (restore func()) {
	saved := listSlotHold
	listSlotHold = d
	return func() { listSlotHold = saved }
}

// ListsAtOnce is how many namespaces may have their first list under way.
const ListsAtOnce = listsAtOnce
