package controller

// KeepFollowed saves the tracker queen_locks_holder_pods_followed reads, for
// a test that makes a tracker of its own (NewPods takes the gauge over), and
// answers a function that puts the saved one back.
func KeepFollowed() (restore func()) {
	saved := followedFrom.Load()
	return func() { followedFrom.Store(saved) }
}
