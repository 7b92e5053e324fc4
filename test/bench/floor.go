package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// floorCycle installs the copy of the CRD and answers a create+delete cycle
// of its objects in ns.
func floorCycle(ctx context.Context, cfg *rest.Config, ns string) (cycle, error) {
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
	obj := func(w int) *unstructured.Unstructured {
		now := time.Now().UTC()
		stamp := func(t time.Time) string { return t.Format("2006-01-02T15:04:05.000000Z") }
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": floorGroup + "/v1alpha1",
			"kind":       "QueenLock",
			"metadata":   map[string]any{"namespace": ns, "name": fmt.Sprintf("floor-%d.0", w)},
			"spec": map[string]any{
				"lock": fmt.Sprintf("floor-%d", w), "slot": int64(0), "limit": int64(1), "owner": fmt.Sprint("w", w), "ttlSeconds": int64(30),
				"acquireTime": stamp(now), "renewTime": stamp(now), "expireTime": stamp(now.Add(30 * time.Second)),
			},
		}}
		return u
	}
	// The new type is served once the API server has read the CRD.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u := obj(-1)
		if err := c.Create(ctx, u); err != nil {
			return false, nil
		}
		return true, c.Delete(ctx, u)
	})
	if err != nil {
		return nil, fmt.Errorf("the floor CRD was never served: %w", err)
	}
	return func(ctx context.Context, w, i int) error {
		u := obj(w)
		if err := c.Create(ctx, u); err != nil {
			return err
		}
		return c.Delete(ctx, u)
	}, nil
}
