package clients_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var (
	env *controlplane.Env
	// root is the module's root: the runners run there, as CI does.
	root string
	// queenlock is the CLI, built for this run; kubeconfig is the admin's,
	// for the tests that delete a permit or write a ConfigMap by hand with
	// kubectl.
	queenlock, kubeconfig, kubectl string
	// tlsDir holds a CA and a serving certificate for a TLS proxy.
	tlsDir string
	// tmp holds all of these until the tests end.
	tmp string
)

func TestMain(m *testing.M) {
	code := controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) {
		env = e
		root = controlplane.Root()
		kubectl = filepath.Join(root, "bin", "kubectl")
		if err := setUp(e); err != nil {
			fmt.Fprintln(os.Stderr, "setting up the clients' tests:", err)
			_ = e.Stop()
			_ = os.RemoveAll(tmp)
			os.Exit(1)
		}
	})
	if tmp != "" {
		_ = os.RemoveAll(tmp)
	}
	os.Exit(code)
}

func setUp(e *controlplane.Env) error {
	if _, err := os.Stat(kubectl); err != nil {
		return fmt.Errorf("bin/kubectl is missing (make tools builds it): %w", err)
	}
	var err error
	if tmp, err = os.MkdirTemp("", "queen-locks-clients-"); err != nil {
		return err
	}
	queenlock = filepath.Join(tmp, "queenlock")
	build := exec.Command("go", "build", "-o", queenlock, "./cmd/queenlock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building queenlock: %v: %s", err, out)
	}
	kubeconfig = filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, e.Env.KubeConfig, 0o600); err != nil {
		return err
	}
	tlsDir = filepath.Join(tmp, "tls")
	return writeTLS(tlsDir)
}

// writeTLS writes a CA (ca.crt) and a serving certificate for 127.0.0.1
// signed by it (tls.crt, tls.key) into dir: the handles' tests put a TLS
// proxy in front of the route and verify it with ca.crt.
func writeTLS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "queen-locks test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return err
		}
	}
	return nil
}
