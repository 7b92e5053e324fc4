package charts

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

const managerUser = "system:serviceaccount:queen-locks:queen-locks-controller-manager"

// twoConditions are the policy's matchConditions before they were one: the
// meaning the one must keep.
var twoConditions = []admissionregistrationv1.MatchCondition{
	{Name: "the-managers-create", Expression: "request.userInfo.username == '" + managerUser + "'"},
	{Name: "stamped", Expression: "has(object.spec.renewTime)"},
}

// policyMatcher is the matchConditions of config/default/manager_creates.yaml
// (or conds) compiled and matched as kube-apiserver does for a
// MutatingAdmissionPolicy (k8s.io/apiserver's policy/mutating, compilePolicy).
func policyMatcher(t testing.TB, conds []admissionregistrationv1.MatchCondition) matchconditions.Matcher {
	t.Helper()
	if conds == nil {
		var policy admissionregistrationv1.MutatingAdmissionPolicy
		b, err := os.ReadFile(filepath.Join(root, "config", "default", "manager_creates.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(strings.Split(string(b), "\n---")[0]), &policy); err != nil {
			t.Fatal(err)
		}
		conds = policy.Spec.MatchConditions
	}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	accessors := make([]plugincel.ExpressionAccessor, len(conds))
	for i := range conds {
		accessors[i] = (*matchconditions.MatchCondition)(&conds[i])
	}
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	ignore := admissionregistrationv1.Ignore
	return matchconditions.NewMatcher(compiler.CompileCondition(accessors, opts, environment.StoredExpressions), &ignore, "policy", "validate", "queen-locks-manager-creates")
}

// createOf is a create of a permit by username, with spec (nil: none).
func createOf(username string, spec map[string]any) *admission.VersionedAttributes {
	gvk := schema.GroupVersionKind{Group: "locks.queen.dev", Version: "v1alpha1", Kind: "QueenLock"}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "locks.queen.dev/v1alpha1", "kind": "QueenLock",
		"metadata": map[string]any{"namespace": "team", "name": "report.0"}}}
	if spec != nil {
		obj.Object["spec"] = spec
	}
	attrs := admission.NewAttributesRecord(obj, nil, gvk, "team", "report.0",
		gvk.GroupVersion().WithResource("queenlocks"), "", admission.Create, &metav1.CreateOptions{}, false,
		&user.DefaultInfo{Name: username})
	return &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(obj)}
}

var creates = map[string]*admission.VersionedAttributes{
	"the manager's, stamped":   createOf(managerUser, map[string]any{"lock": "report", "renewTime": "2026-12-05T10:00:00.000000Z"}),
	"the manager's, unstamped": createOf(managerUser, map[string]any{"lock": "report"}),
	"the manager's, no spec":   createOf(managerUser, nil),
	"another's, stamped":       createOf("system:serviceaccount:team:app", map[string]any{"lock": "report", "renewTime": "2026-12-05T10:00:00.000000Z"}),
	"another's, no spec":       createOf("system:serviceaccount:team:app", nil),
}

// The policy's matchConditions match exactly the creates its two former
// conditions matched: the manager's, stamped; an error (no spec) matches
// nothing under failurePolicy Ignore, as before.
func TestManagerCreatesPolicyMatchesAsItsTwoConditionsDid(t *testing.T) {
	now, before := policyMatcher(t, nil), policyMatcher(t, twoConditions)
	for name, create := range creates {
		got, want := now.Match(context.Background(), create, nil, nil), before.Match(context.Background(), create, nil, nil)
		if got.Matches != want.Matches || (got.Error == nil) != (want.Error == nil) {
			t.Errorf("%s: matches %v (error %v), the two conditions %v (error %v)", name, got.Matches, got.Error, want.Matches, want.Error)
		}
		if wantMatch := name == "the manager's, stamped"; got.Matches != wantMatch {
			t.Errorf("%s: matches %v, want %v", name, got.Matches, wantMatch)
		}
	}
}

// kube-apiserver's cost of the policy's matchConditions per create of the
// manager's (every acquire through the route that creates a permit).
func BenchmarkManagerCreatesMatchConditions(b *testing.B) {
	create := creates["the manager's, stamped"]
	for _, c := range []struct {
		name  string
		conds []admissionregistrationv1.MatchCondition
	}{{"two conditions", twoConditions}, {"config-default", nil}} {
		b.Run(c.name, func(b *testing.B) {
			m := policyMatcher(b, c.conds)
			b.ReportAllocs()
			for b.Loop() {
				if !m.Match(context.Background(), create, nil, nil).Matches {
					b.Fatal("no match")
				}
			}
		})
	}
}
