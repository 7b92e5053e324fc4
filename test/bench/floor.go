package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// The floor row tells how much of the gap to a Lease is the price of a
// custom resource itself: the same CRD (schema and CEL rules) under another
// group, which no webhook intercepts and no informer watches, created and
// deleted with the times the webhook would stamp written by the client.
const floorGroup = "floor.bench.queen.dev"

// installFloor installs the copy of the CRD, once per run, and answers a
// client once the API server serves it.
func installFloor(ctx context.Context, cfg *rest.Config, ns string) (client.Client, error) {
	floorOnce.Do(func() { floorClient, floorErr = installFloorCRD(ctx, cfg, ns) })
	return floorClient, floorErr
}

var (
	floorOnce   sync.Once
	floorClient client.Client
	floorErr    error
)

func installFloorCRD(ctx context.Context, cfg *rest.Config, ns string) (client.Client, error) {
	raw, err := os.ReadFile(filepath.Join(controlplane.Root(), "config", "crd", "bases", "locks.queen.dev_queenlocks.yaml"))
	if err != nil {
		return nil, err
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		return nil, fmt.Errorf("the QueenLock CRD: %w", err)
	}
	if err := unstructured.SetNestedField(crd.Object, floorGroup, "spec", "group"); err != nil {
		return nil, err
	}
	crd.SetName("queenlocks." + floorGroup)
	crd.SetAnnotations(nil)
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, crd); err != nil {
		return nil, fmt.Errorf("installing the floor CRD: %w", err)
	}
	// The new type is served once the API server has read the CRD.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u := floorObject(ns, "floor--1", "probe", time.Now())
		if err := c.Create(ctx, u); err != nil {
			return false, nil
		}
		return true, c.Delete(ctx, u)
	})
	if err != nil {
		return nil, fmt.Errorf("the floor CRD was never served: %w", err)
	}
	return c, nil
}

// floorStamp is the format the webhook stamps times in.
func floorStamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// floorObject is a copy of a permit of lock, held by owner, with the times
// the webhook would stamp at now.
func floorObject(ns, lock, owner string, now time.Time) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": floorGroup + "/v1alpha1",
		"kind":       "QueenLock",
		"metadata":   map[string]any{"namespace": ns, "name": lock + ".0"},
		"spec": map[string]any{
			"lock": lock, "slot": int64(0), "limit": int64(1), "owner": owner, "ttlSeconds": int64(renewTTL),
			"acquireTime": floorStamp(now), "renewTime": floorStamp(now), "expireTime": floorStamp(now.Add(renewTTL * time.Second)),
		},
	}}
}

// floorCycle installs the copy of the CRD and answers a create+delete cycle
// of its objects in ns.
func floorCycle(ctx context.Context, cfg *rest.Config, ns string) (cycle, error) {
	c, err := installFloor(ctx, cfg, ns)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, w, i int) error {
		u := floorObject(ns, fmt.Sprintf("floor-%d", w), fmt.Sprint("w", w), time.Now())
		if err := c.Create(ctx, u); err != nil {
			return err
		}
		return c.Delete(ctx, u)
	}, nil
}

// floorPermits holds copies of permits and renews them as the route
// renews permits: an update of the whole permit it last wrote, with
// renewTime and expireTime stamped by the client (as the route stamps
// them), conditional on the resourceVersion. No webhook is called and no
// route: what a renew costs kube-apiserver for the custom resource alone
// (its schema, its CEL transition rules, JSON), the least any renew of a
// permit could cost it.
type floorPermits struct {
	c    client.Client
	ns   string
	last *sync.Map // name to the *unstructured.Unstructured last written
}

func (f floorPermits) acquire(ctx context.Context, name string) (uint64, error) {
	u := floorObject(f.ns, name, "r", time.Now())
	if err := f.c.Create(ctx, u); err != nil {
		return 0, err
	}
	// Stored without managedFields, as the webhook stores permits: a list
	// of one empty entry clears them, and later updates record none.
	clear := fmt.Sprintf(`{"metadata":{"resourceVersion":%q,"managedFields":[{}]}}`, u.GetResourceVersion())
	if err := f.c.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(clear))); err != nil {
		return 0, err
	}
	if n := len(u.GetManagedFields()); n != 0 {
		return 0, fmt.Errorf("the floor permit %s kept %d managedFields entries", u.GetName(), n)
	}
	f.last.Store(name, u)
	return strconv.ParseUint(u.GetResourceVersion(), 10, 64)
}

func (f floorPermits) renew(ctx context.Context, name string, token uint64) (uint64, string, error) {
	prev, _ := f.last.Load(name)
	u := prev.(*unstructured.Unstructured).DeepCopy()
	u.SetResourceVersion(strconv.FormatUint(token, 10))
	now := time.Now()
	if err := unstructured.SetNestedField(u.Object, floorStamp(now), "spec", "renewTime"); err != nil {
		return 0, "", err
	}
	if err := unstructured.SetNestedField(u.Object, floorStamp(now.Add(renewTTL*time.Second)), "spec", "expireTime"); err != nil {
		return 0, "", err
	}
	if err := f.c.Update(ctx, u); err != nil {
		return 0, "", err
	}
	f.last.Store(name, u)
	tok, err := strconv.ParseUint(u.GetResourceVersion(), 10, 64)
	return tok, "", err
}

func (f floorPermits) release(ctx context.Context, name string, token uint64) {
	rv := strconv.FormatUint(token, 10)
	_ = f.c.Delete(ctx, floorObject(f.ns, name, "r", time.Now()), client.Preconditions{ResourceVersion: &rv})
}
