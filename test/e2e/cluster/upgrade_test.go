package cluster_test

// This file sorts after every other test file: go test runs files in name
// order, and the upgrade and uninstall must come after every test that
// needs the installed chart (e2e_test.go, gated_test.go).

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// TestUpgradeUninstall: helm upgrade keeps the permits; helm uninstall
// keeps the CRD and every QueenLock (crds.keep), as docs/install.md says.
func TestUpgradeUninstall(t *testing.T) {
	needInstall(t)
	ctx := context.Background()
	makeHolder(t, ctx)
	rs := call(t, ctx, routeOf(t, ctx), holderToken(t, ctx),
		map[string]any{"op": "acquire", "name": "kept", "ttlSeconds": 3600, "owner": "upgrade-test"})
	if !rs[0].Acquired {
		t.Fatalf("acquire: %+v", rs[0])
	}
	dyn := dynamic.NewForConfigOrDie(c.Rest).Resource(queenlocks)
	permits := func() map[string]string {
		l, err := dyn.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, item := range l.Items {
			m[item.GetNamespace()+"/"+item.GetName()] = item.GetResourceVersion()
		}
		return m
	}
	before := permits()
	oldPods := map[string]bool{}
	for _, p := range managerPods(t, ctx) {
		oldPods[p.Name] = true
	}

	repo, tag := managerImage(t)
	// A changed value rolls the pods, as a new image would.
	helm(t, ctx, "upgrade", release, filepath.Join(root, "charts", "queen-locks"), "-n", releaseNS,
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "route.tls.caNamespaces={"+holderNS+","+cronNS+"}",
		"--set", "gatedPods.enabled=true",
		"--set", "logLevel=debug", "--wait", "--timeout", "5m")
	await(t, "two new replicas are Ready", 3*time.Minute, func(ctx context.Context) (bool, error) {
		n := 0
		for _, p := range managerPods(t, ctx) {
			if oldPods[p.Name] {
				return false, nil
			}
			if ready(p) {
				n++
			}
		}
		return n == 2, nil
	})
	after := permits()
	if v := after[holderNS+"/kept.0"]; v == "" || v != before[holderNS+"/kept.0"] {
		t.Errorf("the permit kept changed across the upgrade: %q before, %q after", before[holderNS+"/kept.0"], v)
	}

	helm(t, ctx, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "5m")
	if _, err := c.Client.AppsV1().Deployments(releaseNS).Get(ctx, release, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Deployment after uninstall: %v, want NotFound", err)
	}
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, release, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the MutatingWebhookConfiguration after uninstall: %v, want NotFound", err)
	}
	out, err := c.Kubectl(ctx, bin, "get", "crd", "queenlocks.locks.queen.dev", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "customresourcedefinition.apiextensions.k8s.io/queenlocks.locks.queen.dev" {
		t.Errorf("the CRD after uninstall: %q %v; docs/install.md says it stays", out, err)
	}
	left := permits()
	if left[holderNS+"/kept.0"] != after[holderNS+"/kept.0"] {
		t.Errorf("the permit kept after uninstall: %q, want it as it was (%q)", left[holderNS+"/kept.0"], after[holderNS+"/kept.0"])
	}
	installed = false
}
