// Package testcert makes throwaway certificate authorities and serving
// certificates for tests that speak TLS to a route on loopback. The route,
// the Go handle, the CLI and the other languages' handles are each tested
// over TLS; they share this one generator so that they all verify the same
// kind of certificate chain a cluster's issuer would give them: a CA that
// clients are told to trust, and a leaf it signs for the server.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"
)

// validity is how long the certificates are good for, either side of now:
// long enough for any test run, and the hour before now absorbs clock skew
// between the processes that check it.
const validity = 24 * time.Hour

// CA is a certificate authority made for one test or one test binary.
type CA struct {
	// PEM is the CA's certificate, PEM-encoded: what a client is given as
	// its CA file to trust the certificates Serving makes.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// New makes a CA with a fresh key, so that two CAs never trust each
// other's certificates.
func New() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the test CA's key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "queen-locks test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing the test CA's certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the test CA's certificate: %w", err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// Serving makes a server certificate for hosts (IP addresses or DNS
// names) signed by the CA. It answers it ready for a tls.Config, and as
// the PEM of the certificate and of its key (PKCS #8, which Go, OpenSSL
// and Node all read) for servers that load files.
func (ca *CA) Serving(hosts ...string) (cert tls.Certificate, certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, nil, nil, errors.New("a serving certificate needs at least one host")
	}
	return ca.leaf(hosts[0], x509.ExtKeyUsageServerAuth, hosts)
}

// ClientCert makes a client certificate for name (its CommonName) signed
// by the CA, as PEM of the certificate and of its key: what the API server
// presents to webhooks when its admission configuration gives it one.
func (ca *CA) ClientCert(name string) (certPEM, keyPEM []byte, err error) {
	_, certPEM, keyPEM, err = ca.leaf(name, x509.ExtKeyUsageClientAuth, nil)
	return certPEM, keyPEM, err
}

// leaf makes a certificate for name, with usage, for hosts, signed by the CA.
func (ca *CA) leaf(name string, usage x509.ExtKeyUsage, hosts []string) (cert tls.Certificate, certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("generating the key of %s: %w", name, err)
	}
	serial, err := serialNumber()
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("signing the certificate of %s: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("encoding the key of %s: %w", name, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// WriteServing writes a serving certificate for hosts into dir as tls.crt
// and tls.key, the names a Kubernetes TLS secret mounts. Each file is
// replaced whole by a rename, so a server watching dir for a renewed
// certificate never reads half a file.
func (ca *CA) WriteServing(dir string, hosts ...string) error {
	_, certPEM, keyPEM, err := ca.Serving(hosts...)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making the certificate directory: %w", err)
	}
	// The key first: a watcher that reloads on the key's change still sees
	// the old certificate, fails to pair them and keeps serving the old
	// pair until the certificate's change brings a matching one.
	for _, f := range []struct {
		name string
		data []byte
	}{{"tls.key", keyPEM}, {"tls.crt", certPEM}} {
		tmp := filepath.Join(dir, "."+f.name)
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", f.name, err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("replacing %s: %w", f.name, err)
		}
	}
	return nil
}

// Client is an HTTP client that trusts only the CA. Its timeout makes a
// server that never answers fail the test instead of hanging it.
func (ca *CA) Client() *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// StartServer serves h over TLS on a loopback port with a certificate
// for 127.0.0.1 that the CA signs. The caller closes the server.
func (ca *CA) StartServer(h http.Handler) (*httptest.Server, error) {
	cert, _, _, err := ca.Serving("127.0.0.1")
	if err != nil {
		return nil, err
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	// Tests that check a client refuses an untrusted server make it fail
	// handshakes on purpose; the server's log of each is noise.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	return srv, nil
}

// serialNumber is random, as RFC 5280 asks, so that certificates of
// different CAs made in one test never share issuer and serial.
func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("choosing a serial number: %w", err)
	}
	return n, nil
}
