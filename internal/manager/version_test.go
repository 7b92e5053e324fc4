package manager

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
)

// The manager starts only on an API server at MinServerVersion (1.35) or
// later: older ones have no comparable resourceVersions.

// Versions as API servers report them in /version's gitVersion: release
// builds, and the suffixes of managed offerings.
var (
	refusedVersions  = []string{"v1.34.3", "v1.34.0-gke.1", "v1.34.99", "v1.33.0", "v1.34.2-eks-1234567"}
	acceptedVersions = []string{"v1.35.0", "v1.37.2", "v1.35.4", "v1.36.3", "v1.35.0-gke.1", "v1.36.1+k3s1", "v2.0.0"}
)

func TestCheckVersionRefusesOlderThan135(t *testing.T) {
	for _, v := range refusedVersions {
		err := checkVersion(v)
		if err == nil {
			t.Errorf("%s: accepted, want refused", v)
			continue
		}
		// The refusal names the server's version and the one needed.
		for _, want := range []string{"the API server is Kubernetes " + v, "needs 1.35.0 or later"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", v, err, want)
			}
		}
	}
}

func TestCheckVersionAccepts135AndLater(t *testing.T) {
	for _, v := range acceptedVersions {
		if err := checkVersion(v); err != nil {
			t.Errorf("%s: refused: %v", v, err)
		}
	}
}

func TestCheckVersionRefusesWhatItCannotRead(t *testing.T) {
	// A kube-apiserver built without version ldflags reports
	// v0.0.0-master+$Format:%H$: it is refused as older, not let through.
	for _, v := range []string{"", "unknown", "1", "v0.0.0-master+$Format:%H$"} {
		if err := checkVersion(v); err == nil {
			t.Errorf("%q: accepted, want refused", v)
		}
	}
}

// CheckServerVersion reads /version from the API server, as New does
// before it builds anything.
func TestCheckServerVersionReadsTheServersVersion(t *testing.T) {
	serve := func(t *testing.T, gitVersion string) *rest.Config {
		t.Helper()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/version" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(apiversion.Info{GitVersion: gitVersion})
		}))
		t.Cleanup(srv.Close)
		return &rest.Config{Host: srv.URL}
	}
	for _, v := range refusedVersions {
		t.Run(v, func(t *testing.T) {
			if err := CheckServerVersion(serve(t, v)); err == nil || !strings.Contains(err.Error(), "needs 1.35.0 or later") {
				t.Errorf("err = %v, want a refusal", err)
			}
		})
	}
	for _, v := range acceptedVersions {
		t.Run(v, func(t *testing.T) {
			if err := CheckServerVersion(serve(t, v)); err != nil {
				t.Errorf("refused: %v", err)
			}
		})
	}
	t.Run("no server", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		err := CheckServerVersion(&rest.Config{Host: srv.URL})
		if err == nil || !strings.Contains(err.Error(), "reading the API server's version") {
			t.Errorf("err = %v, want the read to fail", err)
		}
	})
}

// New refuses before it builds a manager.
func TestNewRefusesAnOldServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(apiversion.Info{GitVersion: "v1.34.3"})
	}))
	defer srv.Close()
	if _, err := New(&rest.Config{Host: srv.URL}, Options{}); err == nil || !strings.Contains(err.Error(), "the API server is Kubernetes v1.34.3") {
		t.Fatalf("err = %v, want the version refused", err)
	}
}
