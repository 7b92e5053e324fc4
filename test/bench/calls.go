package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/route"
)

// callPath is one way of reaching the locks.
type callPath struct {
	name string
	t    handle.Transport
}

// callRow is what kube-apiserver counted for n operations of one kind.
type callRow struct {
	path, op string
	n        int
	d        tally
}

// callStep is one kind of operation, done on lock i; it answers an error
// when the outcome is not the one the step is about, so that a count is
// never reported for the wrong path through the code.
type callStep struct {
	op string
	do func(ctx context.Context, i int) error
	// together runs the n operations at once rather than one after
	// another: for the waits, which would otherwise take n times as long.
	together bool
}

// waitedFor is how long the waiting rows wait on a held lock.
const waitedFor = 2 * time.Second

// pollHeld polls a held lock for d as the handles did before waitSeconds
// (100 ms doubling to 1 s), and fails if it is ever acquired.
func pollHeld(ctx context.Context, t handle.Transport, lock string, d time.Duration) error {
	end := time.Now().Add(d)
	for poll := 100 * time.Millisecond; ; poll = min(poll*2, time.Second) {
		a, err := t.Acquire(ctx, lock, "b", 30, 1)
		if err != nil || a.Acquired {
			return unexpected("held", a, err)
		}
		if time.Until(end) <= 0 {
			return nil
		}
		time.Sleep(min(poll, time.Until(end)))
	}
}

// countCalls does n operations of each kind through each path, one after
// another, and reads what kube-apiserver counted around each kind. Nothing
// else touches permits meanwhile, so every lock call counted is theirs.
func countCalls(ctx context.Context, cs kubernetes.Interface, paths []callPath, n int) ([]callRow, error) {
	var rows []callRow
	for pi, p := range paths {
		t := p.t
		lock := func(i int) string { return fmt.Sprintf("calls%d-%d", pi, i) }
		sem := func(i int) string { return fmt.Sprintf("callsem%d-%d", pi, i) }
		tokens := make([]uint64, n)
		semSlots, semTokens := make([]int, n), make([]uint64, n)
		steps := []callStep{
			{op: "acquire, free lock", do: func(ctx context.Context, i int) error {
				a, err := t.Acquire(ctx, lock(i), "a", 30, 1)
				if err != nil || !a.Acquired || a.Already {
					return unexpected("acquired", a, err)
				}
				tokens[i] = a.Token
				return nil
			}},
			{op: "renew", do: func(ctx context.Context, i int) error {
				r, err := t.Renew(ctx, lock(i), 0, tokens[i], "a", 30)
				if err != nil || !r.Renewed {
					return unexpected("renewed", r, err)
				}
				tokens[i] = r.Token
				return nil
			}},
			{op: "acquire, held by another owner", do: func(ctx context.Context, i int) error {
				a, err := t.Acquire(ctx, lock(i), "b", 30, 1)
				if err != nil || a.Acquired || a.Reason != "held" {
					return unexpected("held", a, err)
				}
				return nil
			}},
			{op: "acquire, already held by the same owner", do: func(ctx context.Context, i int) error {
				a, err := t.Acquire(ctx, lock(i), "a", 30, 1)
				if err != nil || !a.Already || a.Token != tokens[i] {
					return unexpected("already", a, err)
				}
				return nil
			}},
			{op: waitingRow, together: true, do: func(ctx context.Context, i int) error {
				wt, ok := t.(handle.WaitingTransport)
				if !ok {
					return fmt.Errorf("the transport cannot wait")
				}
				a, waited, err := wt.AcquireWaiting(ctx, lock(i), "b", 30, 1, waitedFor)
				if err == nil && !waited {
					return fmt.Errorf("the transport cannot wait")
				}
				if err != nil || a.Acquired || a.Reason != "held" {
					return unexpected("held", a, err)
				}
				return nil
			}},
			{op: pollingRow, together: true, do: func(ctx context.Context, i int) error {
				return pollHeld(ctx, t, lock(i), waitedFor)
			}},
			{op: "get", do: func(ctx context.Context, i int) error {
				hs, err := t.Get(ctx, lock(i))
				if err != nil || len(hs) != 1 {
					return unexpected("one holder", hs, err)
				}
				return nil
			}},
			{op: "check", do: func(ctx context.Context, i int) error {
				ok, err := t.Check(ctx, lock(i), 0, tokens[i])
				if err != nil || !ok {
					return unexpected("ok", ok, err)
				}
				return nil
			}},
			{op: "release", do: func(ctx context.Context, i int) error {
				ok, err := t.Release(ctx, lock(i), 0, tokens[i], "a")
				if err != nil || !ok {
					return unexpected("released", ok, err)
				}
				return nil
			}},
			{op: "acquire, semaphore of 4 with room", do: func(ctx context.Context, i int) error {
				a, err := t.Acquire(ctx, sem(i), "a", 30, 4)
				if err != nil || !a.Acquired || a.Already {
					return unexpected("acquired", a, err)
				}
				semSlots[i], semTokens[i] = a.Slot, a.Token
				return nil
			}},
			{op: "release, semaphore slot", do: func(ctx context.Context, i int) error {
				ok, err := t.Release(ctx, sem(i), semSlots[i], semTokens[i], "a")
				if err != nil || !ok {
					return unexpected("released", ok, err)
				}
				return nil
			}},
		}
		for _, s := range steps {
			before, err := settledScrape(ctx, cs)
			if err != nil {
				return nil, err
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				if !s.together {
					errs[i] = s.do(ctx, i)
					continue
				}
				wg.Go(func() { errs[i] = s.do(ctx, i) })
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					return nil, fmt.Errorf("%s, %s of %s: %w", p.name, s.op, lock(i), err)
				}
			}
			after, err := settledScrape(ctx, cs)
			if err != nil {
				return nil, err
			}
			rows = append(rows, callRow{path: p.name, op: s.op, n: n, d: after.minus(before)})
		}
	}
	return rows, nil
}

func unexpected(want string, got any, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("want %s, got %+v", want, got)
}

// writeCalls writes the call counts as a table.
func writeCalls(b *strings.Builder, rows []callRow) {
	fmt.Fprintf(b, "| path | operation | API calls on queenlocks | by verb | admission webhook calls | TokenReviews and SubjectAccessReviews | other API calls in the window |\n")
	fmt.Fprintf(b, "|---|---|---:|---|---|---|---:|\n")
	for _, r := range rows {
		lockCalls, reviews := r.d.split(lockResources), r.d.split(reviewResources)
		review := "none"
		if len(reviews) > 0 {
			review = breakdown(reviews, r.n, false)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %.0f |\n", r.path, r.op,
			perOp(sum(lockCalls), r.n), breakdown(lockCalls, r.n, true), breakdown(r.d.webhooks, r.n, false), review, r.d.other())
	}
}

// holderTokens makes a ServiceAccount per name in ns, each bound to the
// chart's holder role as the docs tell users to, and answers a token of
// audience queen-locks for each, as a projected token volume holds.
func holderTokens(ctx context.Context, cs kubernetes.Interface, ns string, names []string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(controlplane.Root(), "config", "rbac", "holder_role.yaml"))
	if err != nil {
		return nil, err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &role); err != nil {
		return nil, fmt.Errorf("config/rbac/holder_role.yaml: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the holder role: %w", err)
	}
	var tokens []string
	for _, name := range names {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-holder"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{route.Audience}}}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, tr, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("a token for %s: %w", name, err)
		}
		tokens = append(tokens, tr.Status.Token)
	}
	return tokens, nil
}

// awaitRBAC waits until the API server's authorizer lets each ServiceAccount
// of names release a permit in ns: the route caches a denial too, so a call
// sent before the RoleBinding is seen would be refused for seconds.
func awaitRBAC(ctx context.Context, cs kubernetes.Interface, ns string, names []string) error {
	for _, name := range names {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   serviceaccount.MakeUsername(ns, name),
			Groups: serviceaccount.MakeGroupNames(ns),
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "delete", Group: "locks.queen.dev", Resource: "queenlocks",
			},
		}}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			return err == nil && got.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("the holder role of %s never took effect: %w", name, err)
		}
	}
	return nil
}
