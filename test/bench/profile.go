package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// profileDir, when set, receives CPU profiles of one row (-profile).
var profileDir string

// startProfiles starts a CPU profile of this process, which runs the
// manager's route and webhooks as well as the clients, and asks
// kube-apiserver for one of its own over the same d (its /debug/pprof is on
// by default, and the admin identity may read it). stop ends both and writes
// NAME-bench.pprof and NAME-apiserver.pprof.
func startProfiles(cfg *rest.Config, d time.Duration, name string) (stop func() error, err error) {
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(profileDir, name+"-bench.pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	type answer struct {
		raw []byte
		err error
	}
	apiserver := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
		defer cancel()
		raw, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", fmt.Sprint(int(d.Seconds()))).DoRaw(ctx)
		apiserver <- answer{raw, err}
	}()
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return err
		}
		a := <-apiserver
		if a.err != nil {
			return fmt.Errorf("kube-apiserver's profile: %w", a.err)
		}
		return os.WriteFile(filepath.Join(profileDir, name+"-apiserver.pprof"), a.raw, 0o644)
	}, nil
}
