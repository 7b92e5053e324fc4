package route

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/routeapi"
)

// run carries out the operations of an authorized caller concurrently and
// answers them in order. An operation that the API server could not carry
// out fails the whole call: 400 for a namespace that does not exist, else
// 503. start is when the call came in, for the acquires' wait times.
func (s *Server) run(ctx context.Context, caller Caller, ns string, ops []Operation, start time.Time) ([]routeapi.Result, *callError) {
	if log := s.cfg.Log.V(1); log.Enabled() {
		stop := context.AfterFunc(ctx, func() {
			log.Info("the caller went away before its answer; its operations run to their end", "caller", caller.Username, "namespace", ns, "operations", len(ops))
		})
		defer stop()
	}
	results := make([]routeapi.Result, len(ops))
	errs := make([]error, len(ops))
	outcomes := make([]string, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		one := func() {
			// A waiting acquire has its wait on top of the usual bound.
			// Each operation runs to a definite answer even if the caller
			// goes away, so that what it acquired can be given back; only a
			// waiting acquire stops waiting when the caller goes (waiting
			// is what it would otherwise keep doing for nobody).
			bound := s.cfg.OpTimeout + time.Duration(op.WaitSeconds)*time.Second
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
			defer cancel()
			gone, cancelGone := context.WithTimeout(ctx, bound)
			defer cancelGone()
			opStart := s.cfg.Clock.Now()
			results[i], errs[i] = s.do(octx, gone, caller, ns, i, op)
			outcome := results[i].Outcome()
			if errs[i] != nil {
				outcome = "error"
			}
			outcomes[i] = outcome
			operations.WithLabelValues(op.Op, outcome).Inc()
			observe(operationDuration.WithLabelValues(op.Op), s.cfg.Clock.Since(opStart), caller.Username)
			countLoss(ns, op.Op, outcome)
			switch {
			case apierrors.IsNotFound(errs[i]):
				// A namespace that does not exist: the caller's to fix,
				// answered 400 (classify), not a fault to page anyone on.
				s.cfg.Log.Info("lock operation refused: no such namespace", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name)
			case errs[i] != nil:
				s.cfg.Log.Error(errs[i], "lock operation failed", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name)
			}
			// Asked first: the arguments of a line nobody logs would still
			// be boxed, on every operation.
			if log := s.cfg.Log.V(1); log.Enabled() {
				log.Info("lock operation", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name, "slot", results[i].Slot, "outcome", outcome)
			}
		}
		// Most calls carry one operation: it runs on the request's own
		// goroutine, whose stack has already grown to what an API call
		// needs, rather than on a new one that grows it again each time
		// (a tenth of a millisecond of copying stacks per call in the
		// profiles of make bench).
		if len(ops) == 1 {
			one()
		} else {
			wg.Go(one)
		}
	}
	wg.Wait()
	// The call answers now, when its last operation has.
	observeAcquires(ns, caller, ops, outcomes, s.cfg.Clock.Since(start))
	var worst *callError
	for i, err := range errs {
		if err == nil {
			continue
		}
		if e := classify(i, ops[i].Op, err); worst == nil || rank(e.Code) > rank(worst.Code) {
			worst = e
		}
	}
	if ctx.Err() != nil || worst != nil {
		// Nobody receives these results: the caller went away, or the
		// call answers an error. An acquire for an operation that named
		// no owner can then never be renewed or released by its caller,
		// who cannot learn the minted owner, nor retried: it is given
		// back. One with the caller's own owner is left alone: its caller
		// converges by sending the call again, maybe to another replica,
		// which answers already with this very permit, and may renew it
		// before this give-back would run. It ends at its TTL otherwise.
		s.giveBack(ctx, caller, ns, ops, results)
	}
	return results, worst
}

// giveBack deletes what the operations of a call that named no owner
// acquired, each at the version its acquire created and no later one.
func (s *Server) giveBack(ctx context.Context, caller Caller, ns string, ops []Operation, results []routeapi.Result) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	for i, r := range results {
		if ops[i].Op != OpAcquire || ops[i].Owner != "" || r.Acquired == nil || !*r.Acquired || r.Already || r.Token == nil || r.Slot == nil {
			continue
		}
		if _, err := s.self.GiveBack(rctx, ns, ops[i].Name, *r.Slot, *r.Token); err != nil {
			s.cfg.Log.Error(err, "giving back what a call acquired for an owner it minted, as nobody receives the answer", "caller", caller.Username, "namespace", ns, "name", ops[i].Name)
		}
	}
}

// enterWaiting takes one of the caller's places among the replica's
// waiters, or answers false: the acquire then answers at once, as when the
// replica's waiters are full. Without token auth (loopback only) there is
// one caller and no bound but the replica's.
func (s *Server) enterWaiting(caller Caller) (leave func(), ok bool) {
	if s.reviews == nil {
		return func() {}, true
	}
	return s.adm.enterWaiting(caller.Username)
}

// do carries out one operation with the manager's identity. A permit the
// caller acquires records the caller's pod, when its token is bound to one,
// so that the permit is freed as soon as that pod is gone. ctx does not end
// when the caller goes away; gone does, and only a waiting acquire uses it.
func (s *Server) do(ctx, gone context.Context, caller Caller, ns string, i int, op Operation) (routeapi.Result, error) {
	lc := s.self
	res := routeapi.Result{Index: i, Op: op.Op, Name: op.Name}
	switch op.Op {
	case OpAcquire:
		owner := op.Owner
		if owner == "" {
			owner = locks.MintOwner("route-")
		}
		// What a try wins after the caller left comes back here: run
		// decides whether it is given back.
		opts := []locks.AcquireOption{locks.HolderPod(caller.Namespace, caller.PodName, caller.PodUID), locks.KeepWhenGone()}
		actx := ctx
		if op.WaitSeconds > 0 && s.cfg.Waker != nil {
			if leave, ok := s.enterWaiting(caller); ok {
				defer leave()
				// locks runs each try to its end itself, so that what a
				// try won after the caller left is answered, not lost.
				opts = append(opts, locks.WaitUpTo(time.Duration(op.WaitSeconds)*time.Second, s.cfg.Waker))
				actx = gone
			}
		}
		a, err := lc.Acquire(actx, ns, op.Name, owner, op.TTLSeconds, op.Limit, opts...)
		if err != nil {
			return res, err
		}
		res.Acquired = &a.Acquired
		if a.Acquired {
			res.Already = a.Already
			res.Held(a.Permit, ns, op.Name, true)
		} else {
			res.Reason = a.Reason
			if a.Reason == locks.ReasonHeld {
				res.Holders = routeapi.Holders(a.Holders)
				res.Waiting = &a.Waiting
			}
		}
	case OpRenew:
		rn, err := lc.Renew(ctx, ns, op.Name, op.Slot, op.Token, op.Owner, op.TTLSeconds)
		if err != nil {
			return res, err
		}
		res.Renewed = &rn.Renewed
		if rn.Renewed {
			res.Held(rn.Permit, ns, op.Name, false)
		} else {
			res.Reason = rn.Reason
		}
	case OpRelease:
		ok, err := lc.Release(ctx, ns, op.Name, op.Slot, op.Token, op.Owner)
		if err != nil {
			return res, err
		}
		res.Released = &ok
		if !ok {
			res.Reason = locks.ReasonLost
		}
	case OpGet:
		hs, err := lc.Get(ctx, ns, op.Name)
		if err != nil {
			return res, err
		}
		res.Holders = routeapi.Holders(hs)
		n, err := lc.Waiting(ctx, ns, op.Name)
		if err != nil {
			return res, err
		}
		res.Waiting = &n
	case OpCheck:
		ok, err := lc.Check(ctx, ns, op.Name, op.Slot, op.Expect)
		if err != nil {
			return res, err
		}
		res.OK = &ok
		if !ok {
			res.Reason = locks.ReasonKVPrecondition
		}
	}
	return res, nil
}
