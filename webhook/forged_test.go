package webhook_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/queen-locks/queen-locks/permit/gatedpod"
	"github.com/queen-locks/queen-locks/webhook"
)

// forge posts a review straight to the manager's webhook port, as any pod
// that reaches it could where the API server presents no client
// certificate (here it does: the test presents the same one, to stand for
// that case), and answers the response.
func forge(t *testing.T, path string, req admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	wo := env.Env.WebhookInstallOptions
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(wo.LocalServingCAData)
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{env.WebhookClientCert}, MinVersion: tls.VersionTLS12}}}
	req.UID = types.UID("forged")
	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &req})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Post("https://"+net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("decoding the answer (%s): %v", resp.Status, err)
	}
	return out.Response
}

func scaleReview(group, resource, ns, name string) admissionv1.AdmissionRequest {
	return admissionv1.AdmissionRequest{
		Kind:        metav1.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"},
		Resource:    metav1.GroupVersionResource{Group: group, Version: "v1", Resource: resource},
		SubResource: "scale", Operation: admissionv1.Update, Namespace: ns, Name: name,
		Object: runtime.RawExtension{Raw: []byte(`{"apiVersion":"autoscaling/v1","kind":"Scale"}`)},
	}
}

func message(r *admissionv1.AdmissionResponse) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Message
}

// A forged scale review names an object of a kind that is not guarded: it
// is refused without a read, the same whether the object exists or not.
func TestForgedScaleReviewReadsOnlyGuardedKinds(t *testing.T) {
	ns := namespace(t)
	p := env.Pod(t, ns, "there", "default")
	there := forge(t, webhook.GuardSubresourcePath, scaleReview("", "pods", ns, p.Name))
	missing := forge(t, webhook.GuardSubresourcePath, scaleReview("", "pods", ns, "not-there"))
	if there.Allowed || missing.Allowed || message(there) != message(missing) {
		t.Fatalf("a pod that exists and one that does not are told apart: %q / %q", message(there), message(missing))
	}
	if strings.Contains(strings.ToLower(message(missing)), "not found") {
		t.Fatalf("the answer carries the API's error: %q", message(missing))
	}
	// Namespaces, cluster-wide, are not a guarded kind either.
	nsAnswer := forge(t, webhook.GuardSubresourcePath, scaleReview("", "namespaces", "", ns))
	if nsAnswer.Allowed || strings.Contains(message(nsAnswer), "not found") {
		t.Fatalf("a namespace's scale review was answered %q", message(nsAnswer))
	}
}

// A read that fails answers a message of its own, never the API server's
// error text: a missing object of a guarded kind is not named as missing.
func TestForgedReviewErrorsCarryNoAPIText(t *testing.T) {
	r := forge(t, webhook.GuardSubresourcePath, scaleReview("apps", "deployments", "no-such-namespace", "no-such-deployment"))
	if r.Allowed || strings.Contains(strings.ToLower(message(r)), "not found") || strings.Contains(message(r), "no-such") {
		t.Fatalf("the answer carries the API's error: allowed=%v %q", r.Allowed, message(r))
	}
}

// The pod webhook's refusal names the rights holding takes, the same
// whichever of them the ServiceAccount lacks: a review naming any
// ServiceAccount learns whether it may hold locks, and no more.
func TestPodRefusalNamesNoMissingVerb(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	// One ServiceAccount may create and update but not delete; the other
	// may do nothing.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "almost"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"locks.queen.dev"}, Resources: []string{"queenlocks"}, Verbs: []string{"create", "update"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "almost"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "almost"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "almost", Namespace: ns}}}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
	h := &webhook.GatedPods{Core: env.Clientset, Clock: clock.RealClock{}}
	ask := func(sa string) string {
		pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", Labels: map[string]string{gatedpod.Label: gatedpod.LabelValue},
				Annotations: map[string]string{gatedpod.LockAnnotation: "nightly"}},
			Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		r := h.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, Namespace: ns,
			Object: runtime.RawExtension{Raw: raw}}})
		if r.Allowed {
			t.Fatalf("ServiceAccount %s's pod was admitted", sa)
		}
		return strings.ReplaceAll(r.Result.Message, sa, "SA")
	}
	almost, nothing := ask("almost"), ask("nothing")
	if almost != nothing {
		t.Fatalf("the refusals tell which right is missing:\n%s\n%s", almost, nothing)
	}
}
