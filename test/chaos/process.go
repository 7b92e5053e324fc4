package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/queen-locks/queen-locks/test/internal/child"
	"github.com/queen-locks/queen-locks/test/internal/procfs"
)

// proc is a process the harness can kill and start again with the same
// command line: etcd and kube-apiserver (first started by envtest, found
// among this process's children) and the manager.
type proc struct {
	name string
	args []string // args[0] is the binary
	env  []string
	log  io.Writer
	// stdin and stdout, when set, replace the log for those streams.
	stdin  io.Reader
	stdout io.Writer
	pid    int
	proc   *child.Process // nil for a process envtest started, which envtest reaps
}

// findChild finds this process's child running the binary named name.
func findChild(name string) (*proc, error) {
	var found *proc
	var readErr error
	err := procfs.Each("stat", func(pid int, stat []byte) bool {
		// "pid (comm) state ppid ...": comm may hold spaces, so split after
		// its closing parenthesis.
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			return true
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 2 || s[open+1:closing] != name || fields[1] != strconv.Itoa(os.Getpid()) {
			return true
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			readErr = err
			return false
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		found = &proc{name: name, args: args, pid: pid}
		return false
	})
	switch {
	case err != nil:
		return nil, err
	case readErr != nil:
		return nil, readErr
	case found == nil:
		return nil, fmt.Errorf("no child process %q found", name)
	}
	return found, nil
}

// start runs the command line again.
func (p *proc) start() error {
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr, cmd.Stdin = p.log, p.log, p.stdin
	if p.stdout != nil {
		cmd.Stdout = p.stdout
	}
	c, err := child.Start(cmd, nil)
	if err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.pid, p.proc = c.Pid, c
	return nil
}

// exited tells whether a process this harness started has exited (and
// been reaped: its pid may already belong to another process). Of one
// envtest started, the harness cannot tell: see wait.
func (p *proc) exited() bool { return p.proc != nil && p.proc.Exited() }

// signal sends sig to the process, unless it has exited.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return fmt.Errorf("%s (pid %d): %w", p.name, p.pid, syscall.ESRCH)
	}
	if err := syscall.Kill(p.pid, sig); err != nil {
		return fmt.Errorf("%s (pid %d): %w", p.name, p.pid, err)
	}
	return nil
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return p.wait(time.Minute)
}

// stop asks the process to stop (SIGTERM), then kills it after timeout.
func (p *proc) stop(timeout time.Duration) error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	if p.wait(timeout) == nil {
		return nil
	}
	return p.kill()
}

// wait waits until the process has exited. A process envtest started is
// reaped by envtest; it is gone when signal 0 no longer reaches it.
func (p *proc) wait(timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		if p.proc != nil {
			select {
			case <-p.proc.Done():
				return nil
			case <-deadline:
				return fmt.Errorf("%s (pid %d) did not exit in %s", p.name, p.pid, timeout)
			}
		}
		if err := syscall.Kill(p.pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf("%s (pid %d) did not exit in %s", p.name, p.pid, timeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
