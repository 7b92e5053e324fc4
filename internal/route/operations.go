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
			s.cfg.Log.V(1).Info("lock operation", "caller", caller.Username, "namespace", ns, "op", op.Op, "name", op.Name, "slot", results[i].Slot, "outcome", outcome)
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
	switch {
	case ctx.Err() != nil:
		s.giveBack(ctx, caller, ns, ops, results, func(Operation) bool { return true })
	case worst != nil:
		// The call answers an error, not its results: an acquire it won
		// for an operation that named no owner can never be renewed or
		// released by its caller, who cannot learn the minted owner. A
		// caller that named its owner converges by sending the call again.
		s.giveBack(ctx, caller, ns, ops, results, func(op Operation) bool { return op.Owner == "" })
	}
	return results, worst
}

// giveBack releases what the operations of a call that were chosen
// acquired, when nobody will receive those tokens (the caller went away
// while a waiting acquire kept the other operations' answers, or the call
// answers an error), so that nobody would release them before their TTLs
// end.
func (s *Server) giveBack(ctx context.Context, caller Caller, ns string, ops []Operation, results []routeapi.Result, chosen func(Operation) bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	for i, r := range results {
		if ops[i].Op != OpAcquire || !chosen(ops[i]) || r.Acquired == nil || !*r.Acquired || r.Already || r.Token == nil || r.Slot == nil {
			continue
		}
		if _, err := s.self.Release(rctx, ns, ops[i].Name, *r.Slot, *r.Token, r.Owner); err != nil {
			s.cfg.Log.Error(err, "releasing what a call acquired after its caller went away", "caller", caller.Username, "namespace", ns, "name", ops[i].Name)
		}
	}
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
		opts := []locks.AcquireOption{locks.HolderPod(caller.Namespace, caller.PodName, caller.PodUID)}
		actx := ctx
		if op.WaitSeconds > 0 && s.cfg.Waker != nil {
			// locks runs each try to its end itself and gives back what a
			// try won after the caller left.
			opts = append(opts, locks.WaitUpTo(time.Duration(op.WaitSeconds)*time.Second, s.cfg.Waker))
			actx = gone
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
