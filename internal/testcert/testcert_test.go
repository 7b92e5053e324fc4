package testcert_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/queen-locks/queen-locks/internal/testcert"
)

// A serving certificate verifies for its hosts against its own CA and no
// other: the TLS tests that rely on a wrong CA being refused depend on it.
func TestServingVerifiesOnlyAgainstItsCA(t *testing.T) {
	ca, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	cert, certPEM, keyPEM, err := ca.Serving("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("the PEM pair does not load: %v", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		if err := verify(ca, leaf, host); err != nil {
			t.Errorf("against its CA for %s: %v", host, err)
		}
	}
	if err := verify(ca, leaf, "example.com"); err == nil {
		t.Error("verified for a host it was not made for")
	}
	if err := verify(other, leaf, "127.0.0.1"); err == nil {
		t.Error("verified against another CA")
	}
	if _, _, _, err := ca.Serving(); err == nil || !strings.Contains(err.Error(), "at least one host") {
		t.Errorf("no hosts: %v", err)
	}
}

func verify(ca *testcert.CA, leaf *x509.Certificate, host string) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.PEM) {
		return os.ErrInvalid
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
	return err
}

// WriteServing leaves a pair a server loads from tls.crt and tls.key, and
// no temporary files beside them.
func TestWriteServing(t *testing.T) {
	ca, err := testcert.New()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	if err := ca.WriteServing(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Fatalf("loading what WriteServing wrote: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "tls.crt,tls.key" {
		t.Fatalf("dir holds %v, want only tls.crt and tls.key", names)
	}
}
