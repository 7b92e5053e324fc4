package route_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/route"
)

// writeCert writes a self-signed certificate for 127.0.0.1 into dir as
// tls.crt and tls.key, each replaced whole, and answers a pool trusting it.
func writeCert(t *testing.T, dir, name string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for file, block := range map[string]*pem.Block{"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER}, "tls.crt": {Type: "CERTIFICATE", Bytes: der}} {
		tmp := filepath.Join(dir, "."+file)
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
			t.Fatal(err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

func trusting(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// The route serves TLS from a directory, and takes a renewed certificate
// without a restart.
func TestTLSAndARenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	first := writeCert(t, dir, "first")
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: namespace(t), TLSCertDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("url %s", url)
	}
	get := func(c *http.Client) (int, error) {
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"operations":[{"op":"get","name":"tls"}]}`))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(trusting(first)); err != nil || code != http.StatusOK {
		t.Fatalf("over TLS: %d %v", code, err)
	}
	if _, err := get(http.DefaultClient); err == nil {
		t.Fatal("a client that does not trust the certificate got through")
	}
	second := writeCert(t, dir, "second")
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, err := get(trusting(second))
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal("the route did not take the renewed certificate")
	}
	if _, err := get(trusting(first)); err == nil {
		t.Fatal("the route still serves the first certificate")
	}

	if _, err := route.New(route.Config{Auth: route.AuthNone, Addr: "127.0.0.1:0", DefaultNamespace: "default", REST: env.Config,
		Scheme: env.Client.Scheme(), Mapper: env.Client.RESTMapper(), TLSCertDir: t.TempDir()}); err == nil ||
		!strings.Contains(err.Error(), "--route-tls-cert-dir") {
		t.Fatalf("an empty certificate directory: %v", err)
	}
}
