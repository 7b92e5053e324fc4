package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/routeapi"
)

// DefaultExpiryGrace is the manager's --expiry-grace unless it is set
// otherwise: the controller deletes a permit this long after its expireTime.
const DefaultExpiryGrace = time.Second

// listOptions are list's flags.
type listOptions struct {
	output string        // json or table
	grace  time.Duration // the manager's expiry grace
	// waiting lists the lines (--waiting) rather than the holders.
	waiting bool
}

// listed is one permit as list prints it: its holder as the route answers
// holders, the holder's pod, and whether it is overdue.
type listed struct {
	routeapi.Holder
	// Pod is the holder's pod, namespace/name, when the permit names one.
	Pod string `json:"pod,omitempty"`
	// Expired marks a permit past its expireTime plus the expiry grace that
	// is still there: the controller should have deleted it (is there a
	// leader? can it delete?). Nobody holds it; the next acquire takes it
	// over.
	Expired bool `json:"expired,omitempty"`
}

// list prints every permit of the namespace, lock by lock: the ones held,
// and the ones past their expireTime and the grace that the controller has
// not deleted, marked expired. A permit expired for less than the grace is
// left out: the controller is about to delete it, and nobody can take it
// over before then. A permit being deleted is left out: it was released.
func list(ctx context.Context, e Env, kc client.Client, ns string, o listOptions) (int, error) {
	var all locksv1alpha1.QueenLockList
	if err := kc.List(ctx, &all, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("listing the permits of namespace %q: %w", ns, err)
	}
	now := time.Now()
	type lockOut struct {
		Name    string   `json:"name"`
		Holders []listed `json:"holders"`
	}
	byName := map[string]*lockOut{}
	var out []*lockOut
	for i := range all.Items {
		p := &all.Items[i]
		if !p.DeletionTimestamp.IsZero() || p.Spec.ExpireTime == nil {
			continue
		}
		overdue := permit.Expired(p, now.Add(-o.grace)) // as the controller judges it
		if permit.Expired(p, now) && !overdue {
			continue
		}
		tok, err := permit.Token(p.ResourceVersion)
		if err != nil {
			return 0, err
		}
		l := byName[p.Spec.Lock]
		if l == nil {
			l = &lockOut{Name: p.Spec.Lock, Holders: []listed{}}
			byName[p.Spec.Lock] = l
			out = append(out, l)
		}
		h := listed{Holder: (*routeapi.Holders([]locks.Holder{{
			Slot: int(p.Spec.Slot), Owner: p.Spec.Owner, Token: tok,
			Since: p.Spec.AcquireTime.Time, RenewedAt: p.Spec.RenewTime.Time, ExpiresAt: p.Spec.ExpireTime.Time,
		}}))[0], Expired: overdue}
		if hp := p.Spec.HolderPod; hp != nil {
			podNS := hp.Namespace
			if podNS == "" {
				podNS = p.Namespace // a permit written before holderPod had a namespace
			}
			h.Pod = podNS + "/" + hp.Name
		}
		l.Holders = append(l.Holders, h)
	}
	if o.output == "table" {
		tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LOCK\tSLOT\tOWNER\tTOKEN\tPOD\tEXPIRES\tEXPIRED")
		for _, l := range out {
			for _, h := range l.Holders {
				pod, expired := h.Pod, ""
				if pod == "" {
					pod = "-"
				}
				if h.Expired {
					expired = "EXPIRED"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\n", l.Name, h.Slot, h.Owner, h.Token, pod, h.ExpiresAt, expired)
			}
		}
		return ExitOK, tw.Flush()
	}
	printJSON(e.Stdout, map[string]any{"namespace": ns, "locks": out})
	return ExitOK, nil
}
