package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
)

// waiting is one waiter as list --waiting prints it.
type waiting struct {
	// Place is the waiter's place in its lock's line, from 1.
	Place   int    `json:"place"`
	Owner   string `json:"owner"`
	Limit   int    `json:"limit"`
	Since   string `json:"since,omitempty"`
	Carrier string `json:"carrier,omitempty"`
}

// listWaiting prints the line of every lock of the namespace that has
// one, in its order: who waits, in which place, since when.
func listWaiting(ctx context.Context, e Env, kc client.Client, ns string, o listOptions) (int, error) {
	var all locksv1alpha1.QueenLockWaiterList
	if err := kc.List(ctx, &all, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("listing the waiters of namespace %q: %w", ns, err)
	}
	byLock := map[string][]locksv1alpha1.QueenLockWaiter{}
	var names []string
	for _, w := range all.Items {
		if !w.DeletionTimestamp.IsZero() {
			continue
		}
		if _, ok := byLock[w.Spec.Lock]; !ok {
			names = append(names, w.Spec.Lock)
		}
		byLock[w.Spec.Lock] = append(byLock[w.Spec.Lock], w)
	}
	type lineOut struct {
		Name    string    `json:"name"`
		Waiting []waiting `json:"waiting"`
	}
	out := []lineOut{}
	for _, name := range names {
		ws := byLock[name]
		locks.SortLine(ws)
		l := lineOut{Name: name}
		for i, w := range ws {
			since := ""
			if w.Spec.Since != nil {
				since = w.Spec.Since.UTC().Format(time.RFC3339Nano)
			}
			l.Waiting = append(l.Waiting, waiting{Place: i + 1, Owner: w.Spec.Owner, Limit: int(w.Spec.Limit), Since: since, Carrier: w.Spec.Carrier})
		}
		out = append(out, l)
	}
	if o.output == "table" {
		tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LOCK\tPLACE\tOWNER\tLIMIT\tSINCE\tCARRIER")
		for _, l := range out {
			for _, w := range l.Waiting {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", l.Name, w.Place, w.Owner, w.Limit, w.Since, w.Carrier)
			}
		}
		return ExitOK, tw.Flush()
	}
	printJSON(e.Stdout, map[string]any{"namespace": ns, "lines": out})
	return ExitOK, nil
}
