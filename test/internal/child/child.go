// Package child starts the processes a harness runs beside itself (manager
// replicas, client processes) and tells when each has exited. A harness
// signals them by pid, so it must know when a pid stops being theirs: once
// a process is reaped, the kernel may give its pid to another.
package child

import (
	"os/exec"
	"syscall"
)

// Process is a started process.
type Process struct {
	Pid  int
	done chan struct{}
}

// Start starts cmd in a process group of its own (so that a signal to the
// group reaches what it starts in turn), killed if the harness dies
// first, and reaps it when it exits. then, when not nil, runs after the
// reaping and before Done is closed (to close the process's log, say).
func Start(cmd *exec.Cmd, then func()) (*Process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		if then != nil {
			then()
		}
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited tells whether the process has exited and been reaped: its pid may
// belong to another process by now.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
