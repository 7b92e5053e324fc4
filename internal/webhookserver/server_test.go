package webhookserver_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/internal/webhookserver"
	"github.com/queen-locks/queen-locks/permit"
)

var env *controlplane.Env

// The manager here serves its webhooks without requiring kube-apiserver's
// client certificate, as on a cluster that cannot give it one: what
// bounds the webhook server then is all there is between any pod and it.
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoWebhookClientCert: true}, func(e *controlplane.Env) { env = e }))
}

// deadline bounds every exchange with the server, so that a server that
// never answers fails the test rather than hanging it.
const deadline = 90 * time.Second

func webhookAddr() string {
	wo := env.Env.WebhookInstallOptions
	return net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
}

// dial opens a TLS connection to addr from the loopback address src, as a
// pod with that address would; cert, when set, is presented.
func dial(t *testing.T, addr, src string, cert *tls.Certificate) *tls.Conn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.Env.WebhookInstallOptions.LocalServingCAData)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: deadline}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("dialing %s from %s: %v", addr, src, err)
	}
	_ = c.SetDeadline(time.Now().Add(deadline))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startReview sends a review's headers: with size, a Content-Length of
// size; without, a chunked body. It sends Expect: 100-continue, so that the
// server says when it starts reading the body, and answers the status the
// server sends first (100 when it reads on).
func startReview(t *testing.T, c net.Conn, size int64) (*bufio.Reader, int) {
	t.Helper()
	length := "Transfer-Encoding: chunked\r\n"
	if size >= 0 {
		length = fmt.Sprintf("Content-Length: %d\r\n", size)
	}
	_, err := fmt.Fprintf(c, "POST /validate-queen-dev-v1alpha1-queenlock HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n%s\r\n", length)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to a review's headers: %v", err)
	}
	defer resp.Body.Close()
	return br, resp.StatusCode
}

// A review larger than any the API server sends is answered 413 before a
// byte of its body is read.
func TestOversizedReviewRefusedUnread(t *testing.T) {
	c := dial(t, webhookAddr(), "127.0.0.2", nil)
	if _, code := startReview(t, c, 7_000_000-1); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a review of 7 MB less a byte was answered %d, want 413", code)
	}
}

// Large bodies are held within a budget per source and in all; past them
// a review is answered 429 at once, and the API server's own reviews
// (small) go on being answered meanwhile.
func TestLargeBodiesBounded(t *testing.T) {
	l := webhookserver.DefaultLimits()
	perSource := int(l.MaxBodyMemoryPerSource / l.MaxBody)
	inAll := int(l.MaxBodyMemory / l.MaxBody)
	// One source takes its share, then is refused.
	for i := range perSource + 1 {
		c := dial(t, webhookAddr(), "127.0.0.3", nil)
		_, code := startReview(t, c, -1)
		want := http.StatusContinue
		if i == perSource {
			want = http.StatusTooManyRequests
		}
		if code != want {
			t.Fatalf("chunked review %d from one source was answered %d, want %d", i, code, want)
		}
	}
	// Other sources take the rest, then everyone is refused.
	for i := perSource; i <= inAll; i++ {
		c := dial(t, webhookAddr(), fmt.Sprintf("127.0.1.%d", i), nil)
		_, code := startReview(t, c, l.MaxBody)
		want := http.StatusContinue
		if i == inAll {
			want = http.StatusTooManyRequests
		}
		if code != want {
			t.Fatalf("large review %d was answered %d, want %d", i, code, want)
		}
	}
	// The API server's reviews of permits are small, and still answered.
	ns := env.Namespace(t, "bounded")
	p := &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name("while-flooded", 0)},
		Spec: locksv1alpha1.QueenLockSpec{Lock: "while-flooded", Limit: 1, Owner: "o", TTLSeconds: 30}}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatalf("a permit create while the large-body budget is full: %v", err)
	}
}

// A body that trickles in is cut off by the read timeout; before, it held
// its connection and its buffer for as long as it liked.
func TestTricklingBodyCutOff(t *testing.T) {
	c := dial(t, webhookAddr(), "127.0.0.4", nil)
	br, code := startReview(t, c, 1000)
	if code != http.StatusContinue {
		t.Fatalf("answered %d, want 100", code)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	// The server answers the unfinished read, or just closes: either way
	// the connection ends from its side.
	resp, err := http.ReadResponse(br, nil)
	if err != nil && strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the server kept a trickling body for %s: %v", deadline, err)
	}
	if err == nil {
		resp.Body.Close()
	}
}

// With a client CA, a connection without a certificate it signed is
// refused during the TLS handshake, while kube-apiserver, which presents
// the certificate of its admission configuration, is served.
func TestClientCertificateRequired(t *testing.T) {
	wo := env.Env.WebhookInstallOptions
	srv, err := webhookserver.New(webhookserver.Options{CertDir: wo.LocalServingCertDir, ClientCAFile: env.WebhookClientCAFile})
	if err != nil {
		t.Fatal(err)
	}
	var reviews atomic.Int32
	srv.Register("/probe", &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		reviews.Add(1)
		return admission.Allowed("")
	})})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("the server stopped: %v", err)
		}
	})

	// Without a certificate: the handshake fails (TLS 1.3 tells the client
	// on its first read).
	c := dial(t, ln.Addr().String(), "127.0.0.5", nil)
	_, _ = fmt.Fprintf(c, "GET /probe HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a connection without a client certificate was answered %s", resp.Status)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a connection without a client certificate was not refused at TLS: %v", err)
	}

	// kube-apiserver presents its certificate to a webhook on this server.
	u := "https://" + ln.Addr().String() + "/probe"
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"probe": "client-cert"}}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "client-cert-probe"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "probe.client-cert.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: wo.LocalServingCAData},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			ObjectSelector: sel, FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}}}}
	if err := env.Client.Create(context.Background(), vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vwc) })
	ns := env.Namespace(t, "client-cert")
	// The configuration reaches kube-apiserver's webhook registry shortly
	// after the create: try until a review comes.
	for i := 0; reviews.Load() == 0; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("probe-%d", i), Labels: sel.MatchLabels}}
		if err := env.Client.Create(context.Background(), cm); err != nil {
			t.Fatalf("kube-apiserver's review was refused: %v", err)
		}
		if i == 100 {
			t.Fatal("kube-apiserver never reviewed a labelled ConfigMap")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
