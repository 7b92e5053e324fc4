package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

// findAPIServer finds this control plane's kube-apiserver among the
// machine's processes, as test/bench does: other engineers run their own,
// and only this one has this certificate directory on its command line.
func findAPIServer(env *controlplane.Env) (int, error) {
	dir := env.Env.ControlPlane.APIServer.CertDir
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		if filepath.Base(args[0]) != "kube-apiserver" {
			continue
		}
		for i, a := range args {
			if a == "--cert-dir="+dir || (a == "--cert-dir" && i+1 < len(args) && args[i+1] == dir) {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("could not find this run's kube-apiserver process")
}

// rssOf is a process's resident memory in bytes (VmRSS); 0 when it cannot
// be read.
func rssOf(pid int) int64 {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	return max(statusKB(string(raw), "VmRSS:"), 0) * 1024
}

// meminfo is a /proc/meminfo field in bytes; -1 when it cannot be read.
func meminfo(key string) int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	kb := statusKB(string(raw), key)
	if kb < 0 {
		return -1
	}
	return kb * 1024
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}
