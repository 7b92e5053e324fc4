package webhook_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// A held write: a validating webhook of the test's own, served by this
// process on loopback, that holds one chosen request after every other
// webhook (the guard's mutating one first) admitted it, until the test
// lets it go. It is what a slow webhook, or a paused or overloaded
// kube-apiserver, does to a write between its check and its storage.

const holdPath = "/test-hold"

// holdLabel marks the namespaces whose writes the hold webhook sees.
const holdLabel = "test.locks.queen.dev/hold"

type hold struct {
	entered, release chan struct{}
}

type holds struct {
	mu    sync.Mutex
	armed map[string][]*hold
}

var (
	holdOnce  sync.Once
	theHolds  = &holds{armed: map[string][]*hold{}}
	holdSetup error
)

func holdKey(resource, ns, name, op string) string {
	return resource + "/" + ns + "/" + name + "/" + op
}

// arm holds the next request of op (CREATE, UPDATE, DELETE) on the object
// of resource named ns/name; armed again, the one after, and so on.
func (h *holds) arm(resource, ns, name, op string) *hold {
	x := &hold{entered: make(chan struct{}), release: make(chan struct{})}
	key := holdKey(resource, ns, name, op)
	h.mu.Lock()
	h.armed[key] = append(h.armed[key], x)
	h.mu.Unlock()
	return x
}

func (h *holds) handle(ctx context.Context, req admission.Request) admission.Response {
	key := holdKey(req.Resource.Resource, req.Namespace, req.Name, string(req.Operation))
	var x *hold
	h.mu.Lock()
	if q := h.armed[key]; len(q) > 0 {
		x, h.armed[key] = q[0], q[1:]
	}
	h.mu.Unlock()
	if x != nil {
		close(x.entered)
		select {
		case <-x.release:
		case <-ctx.Done():
		}
	}
	return admission.Allowed("")
}

// awaitHeld waits until the request x holds has reached the hold webhook:
// every webhook before it admitted it.
func awaitHeld(t *testing.T, x *hold, errs <-chan error) {
	t.Helper()
	select {
	case <-x.entered:
	case err := <-errs:
		t.Fatalf("the write ended before it was held: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the write never reached the hold webhook")
	}
}

// holdingNamespace is a namespace whose writes pass the hold webhook,
// registered with kube-apiserver the first time.
func holdingNamespace(t *testing.T) string {
	t.Helper()
	holdOnce.Do(func() { holdSetup = installHold() })
	if holdSetup != nil {
		t.Fatal(holdSetup)
	}
	ns := namespace(t)
	nsObj := &corev1.Namespace{}
	ctx := context.Background()
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	if nsObj.Labels == nil {
		nsObj.Labels = map[string]string{}
	}
	nsObj.Labels[holdLabel] = "true"
	if err := env.Client.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	// kube-apiserver applies a namespace's labels to webhook selection
	// from its informer: wait until a probe write is seen.
	for i := 0; ; i++ {
		name := "probe-" + strconv.Itoa(i)
		x := theHolds.arm("configmaps", ns, name, "CREATE")
		close(x.release)
		if err := env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-x.entered:
			return ns
		default:
		}
		if i > 200 {
			t.Fatal("the hold webhook never saw a write of the namespace")
		}
		time.Sleep(50 * time.Millisecond) // waiting on kube-apiserver's informer, which has no signal to await
	}
}

func installHold() error {
	env.Manager.GetWebhookServer().Register(holdPath, &admission.Webhook{Handler: admission.HandlerFunc(theHolds.handle)})
	wo := env.Env.WebhookInstallOptions
	u := (&url.URL{Scheme: "https", Host: fmt.Sprintf("%s:%d", wo.LocalServingHost, wo.LocalServingPort), Path: holdPath}).String()
	none := admissionregistrationv1.SideEffectClassNone
	fail := admissionregistrationv1.Fail
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "test-hold"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "hold.test.locks.queen.dev",
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: wo.LocalServingCAData},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			TimeoutSeconds:          ptr.To[int32](30),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{holdLabel: "true"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"", "locks.queen.dev"}, APIVersions: []string{"*"},
					Resources: []string{"configmaps", "queenlocks"},
				},
			}},
		}},
	}
	err := env.Client.Create(context.Background(), cfg)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
