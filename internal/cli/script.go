package cli

import (
	"context"
	"flag"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/routeapi"
)

func scriptCmd(ctx context.Context, e Env, op string, args []string) (int, error) {
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	var c common
	c.bind(fs)
	ttl := fs.Duration("ttl", 0, "lifetime (acquire, renew)")
	limit := fs.Int("limit", 1, "semaphore limit (acquire)")
	owner := fs.String("owner", "", "owner (default: minted on acquire)")
	slot := fs.Int("slot", 0, "slot (renew, release)")
	token := fs.Uint64("token", 0, "token (renew, release)")
	var lo listOptions
	fs.StringVar(&lo.output, "output", "json", "json or table (list)")
	fs.StringVar(&lo.output, "o", "json", "json or table (list, shorthand)")
	fs.BoolVar(&lo.waiting, "waiting", false, "list the locks' lines, not their holders (list)")
	fs.DurationVar(&lo.grace, "expiry-grace", DefaultExpiryGrace, "the manager's --expiry-grace: a permit this long past its expireTime is marked expired (list)")
	name, rest, err := parse(fs, args, op != "list")
	if err != nil {
		return 0, err
	}
	if len(rest) > 0 {
		return 0, usageError("unexpected arguments %q", rest)
	}
	if op == "list" && lo.output != "json" && lo.output != "table" {
		return 0, usageError("--output %q: json or table", lo.output)
	}
	if lo.grace < 0 {
		return 0, usageError("--expiry-grace %v: must not be negative", lo.grace)
	}
	t, kc, err := c.transport(e)
	if err != nil {
		return 0, err
	}
	res := routeapi.Result{Op: op, Name: name}
	code := ExitOK
	switch op {
	case "acquire":
		s, err := ttlSeconds(*ttl)
		if err != nil {
			return 0, err
		}
		if permit.ValidateLimit(int64(*limit)) != nil {
			return 0, usageError("--limit %d: must be from 1 to %d", *limit, permit.MaxLimit)
		}
		if *owner == "" {
			*owner = handle.MintOwner()
		}
		a, err := t.Acquire(ctx, name, *owner, s, *limit)
		if err != nil {
			return 0, err
		}
		res.Acquired = &a.Acquired
		if a.Acquired {
			res.Already = a.Already
			res.Held(a.Permit, t.Namespace(), name, true)
		} else {
			res.Reason, code = a.Reason, ExitNotHeld
			if a.Reason == locks.ReasonHeld {
				res.Holders = routeapi.Holders(a.Holders)
				if a.Waiting > 0 {
					// Counted by the route; a direct transport does not.
					res.Waiting = &a.Waiting
				}
			}
		}
	case "renew":
		var s int64
		if *ttl != 0 {
			if s, err = ttlSeconds(*ttl); err != nil {
				return 0, err
			}
		}
		if *token == 0 {
			return 0, usageError("--token is required")
		}
		r, err := t.Renew(ctx, name, *slot, *token, *owner, s)
		if err != nil {
			return 0, err
		}
		res.Renewed = &r.Renewed
		if r.Renewed {
			res.Held(r.Permit, t.Namespace(), name, false)
		} else {
			res.Reason, code = r.Reason, ExitNotHeld
		}
	case "release":
		if *token == 0 {
			return 0, usageError("--token is required")
		}
		ok, err := t.Release(ctx, name, *slot, *token, *owner)
		if err != nil {
			return 0, err
		}
		res.Released = &ok
		if !ok {
			res.Reason, code = locks.ReasonLost, ExitNotHeld
		}
	case "get":
		hs, err := t.Get(ctx, name)
		if err != nil {
			return 0, err
		}
		res.Holders = routeapi.Holders(hs)
	case "list":
		if kc == nil {
			return 0, usageError("list reads every lock of a namespace, which the route does not offer: use --kubeconfig")
		}
		if lo.waiting {
			return listWaiting(ctx, e, kc, t.Namespace(), lo)
		}
		return list(ctx, e, kc, t.Namespace(), lo)
	}
	printJSON(e.Stdout, res)
	return code, nil
}
