package main

import (
	"context"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/queen-locks/queen-locks/internal/testcert"
)

// The hold: a validating webhook the harness serves itself, which holds
// some of the clients' writes and deletes of the guarded ConfigMap inside
// kube-apiserver for 0 to HoldMax, after the guard's mutating webhook
// admitted them (validating webhooks run after every mutating one). That
// is what a slow webhook, or a paused or overloaded kube-apiserver, does
// to a write between its check and its storage: a holder's lease can end
// and the next holder acquire meanwhile, and the check must show that no
// such write is stored once the next acquire was answered.

// HoldMax is the longest the hold keeps a write; HoldShare the share of
// writes it holds.
const (
	HoldMax   = 5 * time.Second
	HoldShare = 0.4
)

// FaultHeld counts the writes and deletes the hold kept for a while (not
// a nemesis step: a steady share of the clients' writes).
const FaultHeld = "guarded write held in kube-apiserver after admission"

type hold struct {
	mu     sync.Mutex
	rand   *rand.Rand
	srv    *httptest.Server
	held   atomic.Int64
	minted atomic.Int64
}

// The hold also keeps every write of a permit whose owner the route
// minted (an acquire sent without one: the semaphore clients' hang-ups,
// client.go) for HoldMintedMin to HoldMintedMax, longer than the caller
// waits for its answer (hangUpAfter): the acquire of a free slot then
// wins after its caller left, and the route must give it back.
const (
	HoldMintedMin = 500 * time.Millisecond
	HoldMintedMax = 1500 * time.Millisecond
)

// FaultHungUp counts the minted owners' permit writes the hold kept.
const FaultHungUp = "acquire without an owner held past its caller's hang-up"

// startHold serves the hold webhook on loopback and registers it with
// kube-apiserver, for the clients' (user ClientUser) writes of Object.
func (c *cluster) startHold(ctx context.Context, seed uint64) error {
	ca, err := testcert.New()
	if err != nil {
		return err
	}
	h := &hold{rand: rand.New(rand.NewPCG(seed, seed^0x5bd1e995))}
	if h.srv, err = ca.StartServer(&admission.Webhook{Handler: admission.HandlerFunc(h.handle)}); err != nil {
		return err
	}
	c.hold = h
	url := h.srv.URL + "/hold"
	minted := h.srv.URL + "/minted"
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "chaos-hold"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "hold.chaos.locks.queen.dev",
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca.PEM},
			SideEffects:             &none,
			// A hold that fails (the harness is never stopped, but a
			// restarted kube-apiserver may not reach it at once) only
			// lets the write through unheld.
			FailurePolicy:     &ignore,
			TimeoutSeconds:    ptr.To[int32](int32((2 * HoldMax) / time.Second)),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": Namespace}},
			MatchConditions: []admissionregistrationv1.MatchCondition{
				{Name: "the-clients", Expression: "request.userInfo.username == '" + ClientUser + "'"},
				{Name: "the-objects", Expression: "request.name == '" + Object + "' || request.name == '" + LeaderObject + "'"},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
		}, {
			Name:                    "minted.chaos.locks.queen.dev",
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &minted, CABundle: ca.PEM},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			TimeoutSeconds:          ptr.To[int32](int32((2 * HoldMintedMax) / time.Second)),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": Namespace}},
			MatchConditions: []admissionregistrationv1.MatchCondition{
				{Name: "minted-owners", Expression: "has(object.spec) && has(object.spec.owner) && object.spec.owner.startsWith('route-')"},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"locks.queen.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"queenlocks"}},
			}},
		}},
	}
	_, err = c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{})
	return err
}

func (h *hold) handle(ctx context.Context, req admission.Request) admission.Response {
	h.mu.Lock()
	held := h.rand.Float64() < HoldShare
	d := time.Duration(h.rand.Int64N(int64(HoldMax) + 1))
	if req.Kind.Kind == "QueenLock" {
		held, d = true, HoldMintedMin+time.Duration(h.rand.Int64N(int64(HoldMintedMax-HoldMintedMin)+1))
	}
	h.mu.Unlock()
	if req.Kind.Kind == "QueenLock" {
		h.minted.Add(1)
		held = false
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if held {
		h.held.Add(1)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return admission.Allowed("")
}

// heldWrites answers how many writes the hold kept.
func (c *cluster) heldWrites() int64 {
	if c.hold == nil {
		return 0
	}
	return c.hold.held.Load()
}

// heldMinted answers how many minted owners' permit writes the hold kept.
func (c *cluster) heldMinted() int64 {
	if c.hold == nil {
		return 0
	}
	return c.hold.minted.Load()
}

func (c *cluster) stopHold() {
	if c.hold != nil {
		c.hold.srv.Close()
	}
}
