package webhook_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/queen-locks/queen-locks/permit"
	"github.com/queen-locks/queen-locks/webhook"
)

// guardKind installs the guard webhooks for one more kind, as the chart
// does for a kind named in guard.rules, and removes them when the test ends.
func guardKind(t *testing.T, group, version, resource string) {
	t.Helper()
	ctx := context.Background()
	wo := env.Env.WebhookInstallOptions
	cc := func(path string) admissionregistrationv1.WebhookClientConfig {
		u := "https://" + net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort)) + path
		return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: wo.LocalServingCAData}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{permit.GuardedLabel: "true"}}
	rule := func(ops []admissionregistrationv1.OperationType, resources ...string) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops,
			Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: resources}}}
	}
	fail, none := ptr.To(admissionregistrationv1.Fail), ptr.To(admissionregistrationv1.SideEffectClassNone)
	cu := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	u := []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	name := "guard-test-" + resource
	m := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "m." + resource + ".test", ClientConfig: cc(webhook.GuardMutatePath),
			Rules: rule(cu, resource), ObjectSelector: sel, FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: []string{"v1"}}}}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "v." + resource + ".test", ClientConfig: cc(webhook.GuardValidatePath), Rules: rule(append(cu, admissionregistrationv1.Delete), resource),
				ObjectSelector: sel, FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: []string{"v1"}},
			{Name: "vs." + resource + ".test", ClientConfig: cc(webhook.GuardSubresourcePath), Rules: rule(u, resource+"/status"),
				ObjectSelector: sel, FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: []string{"v1"}},
			{Name: "vc." + resource + ".test", ClientConfig: cc(webhook.GuardSubresourcePath), Rules: rule(u, resource+"/scale"),
				FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: []string{"v1"}},
		}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), m)
		_ = env.Client.Delete(context.Background(), v)
	})
}

// A kind guarded by the chart is guarded whole: a replaced holder cannot
// change a guarded Deployment through kubectl scale or a status write,
// which carry no guard; the holder writes the object itself.
func TestGuardedKindsAreGuardedWhole(t *testing.T) {
	guardKind(t, "apps", "v1", "deployments")
	ctx := context.Background()
	ns := namespace(t)
	p := newPermit(ns, "deploy", 0, 1, "me", 600)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	tok := token(t, p)
	dep := func(name string, guarded bool) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}}}
		if guarded {
			d.Labels[permit.GuardedLabel] = "true"
			d.Annotations = map[string]string{permit.GuardAnnotation: fmt.Sprintf("deploy#0=%d", tok)}
		}
		if err := env.Client.Create(ctx, d); err != nil {
			t.Fatalf("creating deployment %s: %v", name, err)
		}
		return d
	}
	guarded, plain := dep("guarded", true), dep("plain", false)
	apps := env.Clientset.AppsV1().Deployments(ns)

	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: guarded.Name}, Spec: autoscalingv1.ScaleSpec{Replicas: 5}}
	_, err := apps.UpdateScale(ctx, guarded.Name, scale, metav1.UpdateOptions{})
	refusedWith(t, err, "kv_precondition", `lock "deploy"`, "scale subresource")

	got, err := apps.Get(ctx, guarded.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Status.ObservedGeneration = 42
	_, err = apps.UpdateStatus(ctx, got, metav1.UpdateOptions{})
	refusedWith(t, err, "kv_precondition", "status subresource")

	// The holder changes replicas by writing the object under its guard.
	got.Spec.Replicas = ptr.To[int32](3)
	got.Annotations[permit.GuardAnnotation] = fmt.Sprintf("deploy#0=%d", tok)
	if _, err := apps.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("a guarded write of replicas: %v", err)
	}
	// A Deployment that is not guarded scales as usual.
	if _, err := apps.UpdateScale(ctx, plain.Name, &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: plain.Name},
		Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("scaling a Deployment that is not guarded: %v", err)
	}
}
