// Package procfs reads from Linux's /proc what the benchmarks measure of
// the control plane's processes and of the machine: which processes are
// this run's, their resident memory, the machine's memory and load.
package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Procs are the process IDs of one control plane.
type Procs struct {
	APIServer, Etcd int
}

// Find finds the kube-apiserver serving from certDir and the etcd storing
// in dataDir among the machine's processes: other engineers run their own,
// and only these two have these directories on their command lines.
func Find(certDir, dataDir string) (Procs, error) {
	var p Procs
	err := Each("cmdline", func(pid int, raw []byte) bool {
		args := strings.Split(string(raw), "\x00")
		switch {
		case len(args) == 0:
		case filepath.Base(args[0]) == "kube-apiserver" && hasArg(args, "--cert-dir", certDir):
			p.APIServer = pid
		case filepath.Base(args[0]) == "etcd" && hasArg(args, "--data-dir", dataDir):
			p.Etcd = pid
		}
		return true
	})
	if err != nil {
		return p, err
	}
	if p.APIServer == 0 || p.Etcd == 0 {
		return p, fmt.Errorf("could not find this run's kube-apiserver (%d) and etcd (%d) processes", p.APIServer, p.Etcd)
	}
	return p, nil
}

// Each calls fn with the contents of /proc/<pid>/<file> of each process
// whose file it can read (processes come and go while it walks), until fn
// answers false.
func Each(file string, fn func(pid int, raw []byte) bool) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), file))
		if err != nil {
			continue
		}
		if !fn(pid, raw) {
			break
		}
	}
	return nil
}

// hasArg tells whether args hold flag=value or flag value.
func hasArg(args []string, flag, value string) bool {
	for i, a := range args {
		if a == flag+"="+value || (a == flag && i+1 < len(args) && args[i+1] == value) {
			return true
		}
	}
	return false
}

// RSS is the resident memory (VmRSS) in bytes of a process, pid a number
// or "self"; 0 when it cannot be read.
func RSS(pid string) int64 {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return 0
	}
	return max(kB(string(raw), "VmRSS:"), 0) * 1024
}

// Meminfo is a /proc/meminfo field ("MemTotal:", "MemAvailable:") in
// bytes; -1 when it cannot be read.
func Meminfo(key string) int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	if kb := kB(string(raw), key); kb >= 0 {
		return kb * 1024
	}
	return -1
}

// LoadAvg is the machine's load average over 1, 5 and 15 minutes, as
// "1.16, 1.19, 1.49".
func LoadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}

// kB reads the value in kB of key from the text of a "Key: value kB" file
// (/proc/PID/status, /proc/meminfo); -1 when it is not there.
func kB(text, key string) int64 {
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}
