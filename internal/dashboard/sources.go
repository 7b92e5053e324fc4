package dashboard

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/permit/gatedpod"
)

var (
	queenlocksGVR = locksv1alpha1.GroupVersion.WithResource("queenlocks")
	waitersGVR    = locksv1alpha1.GroupVersion.WithResource("queenlockwaiters")
	podsGVR       = corev1.SchemeGroupVersion.WithResource("pods")
	configMapsGVR = corev1.SchemeGroupVersion.WithResource("configmaps")
	secretsGVR    = corev1.SchemeGroupVersion.WithResource("secrets")
)

// source keeps one kind of row current from a list and a watch made with
// the caller's identity. It is a reflector of its own rather than
// client-go's informer so that the page can say exactly what state each
// watch is in: live, being made again after it broke, or refused.
type source struct {
	name string // what the page calls it: "permits", "gated pods", ...
	kind string // the kind of row it makes
	list func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, string, error)
	wtch func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
	// row answers the row of an object, or nil when the object shows none
	// (a pod that no longer waits, an object not bound to a lock).
	row      func(runtime.Object) (row, error)
	selector string
	// keyOf answers the key an object's row has, or had, for deletes.
	keyOf func(runtime.Object) string
	// guardKind is the kind of object a source of guarded rows reads:
	// two sources make rows of that kind, and each replaces only its own.
	guardKind string
	// waiterKind is the Kind of waiter rows a source of waiters makes
	// ("pod" or "waiter"): two sources make rows of the line, and each
	// replaces only its own.
	waiterKind string
}

func (src *source) owns(r row) bool {
	switch r := r.(type) {
	case *guardedRow:
		return r.Kind == src.guardKind
	case *waiterRow:
		return r.Kind == src.waiterKind
	}
	return true
}

// sources are the watches of the page for namespace ns ("" for all).
func (s *Server) sources(ns string) []*source {
	permits := s.clients.dyn.Resource(queenlocksGVR).Namespace(ns)
	line := s.clients.dyn.Resource(waitersGVR).Namespace(ns)
	pods := s.clients.dyn.Resource(podsGVR).Namespace(ns)
	dynList := func(ri interface {
		List(context.Context, metav1.ListOptions) (*unstructured.UnstructuredList, error)
	}) func(context.Context, metav1.ListOptions) ([]runtime.Object, string, error) {
		return func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, string, error) {
			l, err := ri.List(ctx, o)
			if err != nil {
				return nil, "", err
			}
			out := make([]runtime.Object, len(l.Items))
			for i := range l.Items {
				out[i] = &l.Items[i]
			}
			return out, l.GetResourceVersion(), nil
		}
	}
	out := []*source{
		{
			name: "permits", kind: kindPermit,
			list: dynList(permits), wtch: permits.Watch,
			row: func(o runtime.Object) (row, error) {
				var p locksv1alpha1.QueenLock
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, &p); err != nil {
					return nil, err
				}
				return newPermitRow(&p), nil
			},
			keyOf: func(o runtime.Object) string {
				m, _ := meta.Accessor(o)
				return m.GetNamespace() + "/" + m.GetName()
			},
		},
		{
			name: "waiters", kind: kindWaiter, waiterKind: "waiter",
			list: dynList(line), wtch: line.Watch,
			row: func(o runtime.Object) (row, error) {
				var w locksv1alpha1.QueenLockWaiter
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, &w); err != nil {
					return nil, err
				}
				if r := newLineWaiter(&w); r != nil {
					return r, nil
				}
				return nil, nil
			},
			keyOf: func(o runtime.Object) string {
				m, _ := meta.Accessor(o)
				return "waiter:" + m.GetNamespace() + "/" + m.GetName()
			},
		},
		{
			name: "gated pods", kind: kindWaiter, waiterKind: "pod", selector: gatedpod.Label + "=" + gatedpod.LabelValue,
			list: dynList(pods), wtch: pods.Watch,
			row: func(o runtime.Object) (row, error) {
				var p corev1.Pod
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, &p); err != nil {
					return nil, err
				}
				if w := newPodWaiter(&p); w != nil {
					return w, nil
				}
				return nil, nil
			},
			keyOf: func(o runtime.Object) string {
				m, _ := meta.Accessor(o)
				return "pod:" + m.GetNamespace() + "/" + m.GetName()
			},
		},
	}
	for _, g := range []struct {
		kind string
		gvr  schema.GroupVersionResource
	}{{"ConfigMap", configMapsGVR}, {"Secret", secretsGVR}} {
		// Metadata only: the page needs the label and the fence record,
		// and a Secret's data must never leave the API server for it.
		ri := s.clients.meta.Resource(g.gvr).Namespace(ns)
		out = append(out, &source{
			name: "guarded " + g.kind + "s", kind: kindGuarded, guardKind: g.kind,
			selector: permit.GuardedLabel + "=true",
			list: func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, string, error) {
				l, err := ri.List(ctx, o)
				if err != nil {
					return nil, "", err
				}
				out := make([]runtime.Object, len(l.Items))
				for i := range l.Items {
					out[i] = &l.Items[i]
				}
				return out, l.ResourceVersion, nil
			},
			wtch: ri.Watch,
			row: func(o runtime.Object) (row, error) {
				m, ok := o.(*metav1.PartialObjectMetadata)
				if !ok {
					return nil, fmt.Errorf("a %s watch sent %T", g.kind, o)
				}
				if r := newGuardedRow(g.kind, &m.ObjectMeta); r != nil {
					return r, nil
				}
				return nil, nil
			},
			keyOf: func(o runtime.Object) string {
				m, _ := meta.Accessor(o)
				return g.kind + ":" + m.GetNamespace() + "/" + m.GetName()
			},
		})
	}
	return out
}

// run keeps the source's rows current until ctx ends: list, then watch
// from the list's resourceVersion; a watch that ends is made again from
// the last version seen, and one that cannot be (expired version, an
// error) is listed anew. Every failure is shown on the page.
func (src *source) run(ctx context.Context, h *hub) {
	h.setStatus(status{Source: src.name, Kind: src.kind, State: stateConnecting})
	backoff := time.Second
	for ctx.Err() == nil {
		listed := time.Now()
		rv, err := src.relist(ctx, h)
		if err == nil {
			backoff = time.Second
			err = src.follow(ctx, h, rv)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil && time.Since(listed) < time.Second {
			// Lists as fast as watches end would hammer the API server
			// that ends them: at most one a second.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			st := status{Source: src.name, Kind: src.kind, State: stateBroken, Message: err.Error()}
			if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				// Nothing is shown that the caller may not list now, as
				// kubectl would show nothing.
				st.State = stateForbidden
				h.reset(src.kind, src.name, src.owns, nil)
			}
			h.setStatus(st)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

func (src *source) relist(ctx context.Context, h *hub) (string, error) {
	objs, rv, err := src.list(ctx, metav1.ListOptions{LabelSelector: src.selector})
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", src.name, err)
	}
	rows := make([]row, 0, len(objs))
	for _, o := range objs {
		r, err := src.row(o)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", src.name, err)
		}
		if r != nil {
			rows = append(rows, r)
		}
	}
	h.reset(src.kind, src.name, src.owns, rows)
	h.setStatus(status{Source: src.name, Kind: src.kind, State: stateLive})
	return rv, nil
}

// errRelist asks run to list again: the watch's version is too old.
var errRelist = errors.New("relist")

// follow applies watch events, making the watch again from the last
// version seen whenever it ends as watches do (the server's timeout). It
// answers nil when a relist is needed, or an error.
func (src *source) follow(ctx context.Context, h *hub, rv string) error {
	for {
		w, err := src.wtch(ctx, metav1.ListOptions{
			LabelSelector: src.selector, ResourceVersion: rv, AllowWatchBookmarks: true,
		})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return nil
			}
			return fmt.Errorf("watching %s: %w", src.name, err)
		}
		var n int
		rv, n, err = src.drain(ctx, h, w, rv)
		w.Stop()
		if errors.Is(err, errRelist) {
			return nil
		}
		if err == nil && n == 0 && ctx.Err() == nil {
			// A watch that ends having sent nothing, not even a bookmark,
			// is client-go's answer when it could not reach the API server
			// (an empty watch, no error): a list tells which it was, and
			// shows the watch broken when it was.
			return nil
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// drain applies one watch's events until it ends, and answers the last
// version seen and how many events came.
func (src *source) drain(ctx context.Context, h *hub, w watch.Interface, rv string) (last string, n int, err error) {
	for {
		select {
		case <-ctx.Done():
			return rv, n, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, n, nil
			}
			n++
			switch ev.Type {
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					return rv, n, errRelist
				}
				return rv, n, fmt.Errorf("watching %s: %w", src.name, err)
			case watch.Bookmark:
				if m, err := meta.Accessor(ev.Object); err == nil {
					rv = m.GetResourceVersion()
				}
				continue
			}
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = m.GetResourceVersion()
			if ev.Type == watch.Deleted {
				h.remove(src.kind, src.keyOf(ev.Object))
				continue
			}
			r, err := src.row(ev.Object)
			if err != nil {
				return rv, n, fmt.Errorf("reading %s: %w", src.name, err)
			}
			if r == nil {
				h.remove(src.kind, src.keyOf(ev.Object))
				continue
			}
			h.upsert(src.kind, r)
		}
	}
}
