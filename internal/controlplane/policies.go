package controlplane

import (
	"context"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/permit"
)

// BlockPermitDeletes refuses every delete of a permit in ns, the
// controller's included, with a ValidatingAdmissionPolicy, until the test
// ends: expired permits then stay, as they do when expiry cannot delete (no
// leader, or its deletes refused). It holds the lock "probe" in ns for an
// hour, and returns once the API server refuses a dry-run delete of it.
func (e *Env) BlockPermitDeletes(t T, ns string) {
	t.Helper()
	ctx := context.Background()
	name := "block-permit-deletes-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
						Resources: []string{"queenlocks"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "the test blocks deletes of permits here",
				Reason: ptr.To(metav1.StatusReasonForbidden)}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := e.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), o) })
	}
	a, err := locks.New(e.Client, nil).Acquire(ctx, ns, "probe", "probe", 3600, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	// The API server compiles the policy in the background.
	probe := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name("probe", 0)}}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsForbidden(e.Client.Delete(ctx, probe, client.DryRunAll)), nil
	})
	if err != nil {
		t.Fatalf("the policy blocking permit deletes in %s never took effect: %v", ns, err)
	}
}
