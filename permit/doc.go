// Package permit holds the rules of a QueenLock permit in one place: how a
// permit is named, what a lock name, owner, lifetime, limit and slot may be,
// how a token is read from a resourceVersion, when a permit has expired, and
// which writes are lock transitions. The admission webhook, the HTTP route and
// the Go handles all call it, so they cannot drift apart.
package permit
