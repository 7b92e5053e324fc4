package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// crdRules is the validator kube-apiserver builds from the QueenLock CRD's
// CEL rules, and the structural schema it validates against.
func crdRules(tb testing.TB) (*cel.Validator, *structuralschema.Structural) {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(controlplane.Root(), "config", "crd", "bases", "locks.queen.dev_queenlocks.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(raw, crd); err != nil {
		tb.Fatal(err)
	}
	in := &apiextensionsinternal.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(crd.Spec.Versions[0].Schema, in, nil); err != nil {
		tb.Fatal(err)
	}
	ss, err := structuralschema.NewStructural(in.OpenAPIV3Schema)
	if err != nil {
		tb.Fatal(err)
	}
	return cel.NewValidator(ss, true, celconfig.PerCallLimit), ss
}

// permitAt is a permit as stored, decoded as kube-apiserver decodes it.
func permitAt(acquire, renew time.Time, firstToken int64) map[string]any {
	spec := map[string]any{
		"lock": "job", "slot": int64(0), "limit": int64(1), "owner": "w1", "ttlSeconds": int64(30),
		"acquireTime": floorStamp(acquire), "renewTime": floorStamp(renew), "expireTime": floorStamp(renew.Add(30 * time.Second)),
		"holderPod": map[string]any{"namespace": "team", "name": "job-1", "uid": "6a1f7e0c-0000-4000-8000-000000000001"},
	}
	if firstToken != 0 {
		spec["firstToken"] = firstToken
	}
	return map[string]any{
		"apiVersion": "locks.queen.dev/v1alpha1", "kind": "QueenLock",
		"metadata": map[string]any{"namespace": "team", "name": "job.0", "labels": map[string]any{"locks.queen.dev/lock": "job"}},
		"spec":     spec,
	}
}

// The CRD's CEL rules on a renew, as kube-apiserver runs them on every
// update of a permit (the manager's stamped ones included): what they cost
// kube-apiserver per renew, in time and allocations, apart from the rest of
// the write. Run with go test -bench CRDRules -benchmem ./test/bench.
func BenchmarkCRDRulesOnARenew(b *testing.B) {
	v, ss := crdRules(b)
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	old, renewed := permitAt(t0, t0.Add(10*time.Second), 41), permitAt(t0, t0.Add(20*time.Second), 41)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if errs, _ := v.Validate(ctx, nil, ss, renewed, old, celconfig.RuntimeCELCostBudget); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}
