package dashboard_test

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// queenlock dashboard, as a person runs it: the URL with its secret alone
// on the first line of standard output, the page served with the
// kubeconfig's identity, and an interrupt that stops it.
func TestQueenlockDashboardCommand(t *testing.T) {
	ns := env.Namespace(t, "dash-cli")
	viewer := identity(t, ns, "viewer", map[string][]string{ns: {"queen-locks-viewer"}})
	acquire(t, ns, "from-the-cli", "someone", 600)
	dir := t.TempDir()
	bin := filepath.Join(dir, "queenlock")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/queenlock").CombinedOutput(); err != nil {
		t.Fatalf("building queenlock: %v: %s", err, out)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: viewer.Host, CertificateAuthorityData: viewer.CAData}
	kc.AuthInfos["viewer"] = &clientcmdapi.AuthInfo{Token: viewer.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "viewer", Namespace: ns}
	kc.CurrentContext = "test"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	for _, bad := range [][]string{{"-n", ns, "-A"}, {"extra"}, {"--port", "70000"}} {
		cmd := exec.Command(bin, append([]string{"dashboard", "--kubeconfig", kubeconfig, "--no-open"}, bad...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || cmd.ProcessState.ExitCode() == 0 || len(out) == 0 {
			t.Errorf("dashboard %v: %v %q, want a refusal", bad, err, out)
		}
	}

	// The namespace is the kubeconfig context's.
	cmd := exec.Command(bin, "dashboard", "--kubeconfig", kubeconfig, "--no-open")
	cmd.Env = append(os.Environ(), "BROWSER=false")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the URL: %v (stderr %q)", err, stderr.String())
	}
	url := strings.TrimSpace(line)
	if !strings.HasPrefix(url, "http://127.0.0.1:") || len(strings.Trim(url[len("http://127.0.0.1:"):], "/0123456789")) < 40 {
		t.Fatalf("first line %q: want http://127.0.0.1:PORT/SECRET/", url)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the printed URL: %s", resp.Status)
	}
	st := openStreamURL(t, url)
	st.until("the permit", func(m *model) bool { _, ok := m.permits[ns+"/from-the-cli.0"]; return ok })
	if st.model.scope != ns {
		t.Fatalf("scope %q, want the context's namespace %q", st.model.scope, ns)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after an interrupt: %v (stderr %q)", err, stderr.String())
	}
}
