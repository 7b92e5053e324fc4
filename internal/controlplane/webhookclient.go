package controlplane

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"github.com/queen-locks/queen-locks/internal/testcert"
)

// WebhookClientName is the CommonName of the certificate kube-apiserver
// presents to the webhooks here.
const WebhookClientName = "kube-apiserver-webhook-client"

// webhookClient makes a CA and a client certificate it signs, and the
// admission configuration that has kube-apiserver present that
// certificate to every webhook, as docs/install.md tells a cluster's
// administrator to: the manager then refuses, at TLS, every connection to
// its webhook port that is not kube-apiserver's. It answers the file
// kube-apiserver's --admission-control-config-file names, the CA file the
// manager's --webhook-client-ca-file names, and the certificate itself,
// for tests that speak to the webhooks as kube-apiserver does.
func webhookClient(dir string) (configFile, caFile string, cert tls.Certificate, err error) {
	ca, err := testcert.New()
	if err != nil {
		return "", "", tls.Certificate{}, err
	}
	certPEM, keyPEM, err := ca.ClientCert(WebhookClientName)
	if err != nil {
		return "", "", tls.Certificate{}, err
	}
	if cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return "", "", tls.Certificate{}, err
	}
	// The user "*" is used for every webhook, whatever its host and port.
	kubeconfig := map[string]any{
		"apiVersion": "v1", "kind": "Config",
		"users": []any{map[string]any{"name": "*", "user": map[string]any{
			"client-certificate-data": certPEM, "client-key-data": keyPEM}}},
	}
	kubeconfigFile := filepath.Join(dir, "webhook-client.kubeconfig")
	plugin := func(name string) map[string]any {
		return map[string]any{"name": name, "configuration": map[string]any{
			"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration", "kubeConfigFile": kubeconfigFile}}
	}
	admission := map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
		"plugins": []any{plugin("ValidatingAdmissionWebhook"), plugin("MutatingAdmissionWebhook")},
	}
	configFile = filepath.Join(dir, "admission.yaml")
	caFile = filepath.Join(dir, "webhook-client-ca.crt")
	for _, f := range []struct {
		path string
		v    any
	}{{kubeconfigFile, kubeconfig}, {configFile, admission}} {
		b, err := yaml.Marshal(f.v)
		if err != nil {
			return "", "", tls.Certificate{}, err
		}
		if err := os.WriteFile(f.path, b, 0o600); err != nil {
			return "", "", tls.Certificate{}, fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		return "", "", tls.Certificate{}, err
	}
	return configFile, caFile, cert, nil
}
