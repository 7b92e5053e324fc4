package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/permit"
)

// runCmd is `queenlock run`: CMD runs only while this process holds the lock,
// and the lock is released before queenlock exits, whatever ends it short of
// SIGKILL.
func runCmd(ctx context.Context, e Env, args []string) (int, error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var c common
	c.bind(fs)
	ttl := fs.Duration("ttl", 0, "lifetime of the lock, renewed every third of it while CMD runs (required)")
	limit := fs.Int("limit", 1, "run at most N at a time (a semaphore)")
	wait := fs.Duration("wait", 0, "wait up to this long for the lock instead of skipping at once")
	owner := fs.String("owner", "", "owner (default: host:pid:random)")
	heldCode := fs.Int("held-exit-code", 0, "exit status when the lock is held elsewhere and CMD is skipped")
	grace := fs.Duration("grace", 10*time.Second, "after SIGTERM (lost lock, or passed on), how long CMD has before SIGKILL")
	name, cmdArgs, err := parse(fs, args, true)
	if err != nil {
		return 0, err
	}
	if len(cmdArgs) == 0 {
		return 0, usageError("a command to run is required after --")
	}
	if _, err := ttlSeconds(*ttl); err != nil {
		return 0, err
	}
	if permit.ValidateLimit(int64(*limit)) != nil {
		return 0, usageError("--limit %d: must be from 1 to %d", *limit, permit.MaxLimit)
	}
	t, _, err := c.transport(e)
	if err != nil {
		return 0, err
	}

	// Catch SIGTERM, SIGINT and SIGHUP from here until the lock is
	// released, instead of leaving them to their default dispositions: a
	// signal must neither end queenlock while it holds (or may hold) the
	// lock nor be lost. As a container's PID 1 this matters twice: the
	// kernel does not deliver a signal to a namespace's init for which it
	// has no handler, so without these handlers `docker stop` or a pod's
	// deletion would go unheard until SIGKILL.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &relay{term: make(chan struct{}, 1)}
	relayDone := make(chan struct{})
	defer close(relayDone)
	go r.run(sigs, cancel, relayDone)

	var opts []handle.Option
	if *owner != "" {
		opts = append(opts, handle.WithOwner(*owner))
	}
	h := handle.New(t).Semaphore(name, *limit, *ttl, opts...)

	dir, err := os.MkdirTemp("", "queenlock-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	tf := newTokenFile(dir, func(err error) {
		fmt.Fprintf(e.Stderr, "queenlock: writing the token file: %v\n", err)
	})
	defer tf.close()
	h.OnRenew(tf.set)
	h.OnLost(func(reason string) {
		fmt.Fprintf(e.Stderr, "queenlock: lost the lock %q (%s); stopping the command\n", name, reason)
	})

	status, ran := ExitOK, false
	acquired, err := h.Run(ctx, func(lockCtx context.Context) error {
		// A renew may already have written a newer token: set keeps the
		// newest, and flush waits for the file to hold at least this one.
		tf.set(h.Token())
		if err := tf.flush(); err != nil {
			return fmt.Errorf("writing the token file: %w", err)
		}
		cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = e.Stdin, e.Stdout, e.Stderr
		cmd.Env = append(os.Environ(),
			"QUEEN_LOCK_NAME="+name,
			"QUEEN_LOCK_SLOT="+strconv.Itoa(h.Slot()),
			"QUEEN_LOCK_TOKEN="+strconv.FormatUint(h.Token(), 10),
			"QUEEN_LOCK_TOKEN_FILE="+tf.path,
		)
		// Its own process group, so a lost lock stops CMD and its children.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := r.start(cmd); err != nil {
			if errors.Is(err, errSignalled) {
				return nil // stopped before CMD ran; Run releases
			}
			return fmt.Errorf("starting %s: %w", cmdArgs[0], err)
		}
		ran = true
		status = supervise(lockCtx, cmd, *grace, r.term)
		r.finish()
		if errors.Is(context.Cause(lockCtx), handle.ErrLost) && status == ExitOK {
			status = ExitLost
		}
		return nil
	}, handle.Wait(*wait), handle.Waiting(func(reason string) {
		fmt.Fprintf(e.Stderr, "queenlock: %q is %s elsewhere; waiting up to %v\n", name, reason, *wait)
	}))
	if sig := r.stoppedBy(); sig != 0 && !ran {
		// Run has released whatever it held or might have held, unless
		// it says otherwise.
		if rerr := beyondCancel(err); rerr != nil {
			fmt.Fprintf(e.Stderr, "queenlock: %v before the command ran: %v\n", sig, rerr)
		} else {
			fmt.Fprintf(e.Stderr, "queenlock: %v before the command ran; the lock is not held\n", sig)
		}
		return 128 + int(sig), nil
	}
	if err != nil {
		if ran {
			// CMD ran: its status is the answer; the release that failed
			// leaves the permit to expire within the TTL.
			fmt.Fprintf(e.Stderr, "queenlock: %v\n", err)
			return status, nil
		}
		return 0, err
	}
	if !acquired {
		fmt.Fprintf(e.Stderr, "queenlock: %q is %s elsewhere; not running the command\n", name, h.Reason())
		return *heldCode, nil
	}
	return status, nil
}

// beyondCancel is err without the context's cancellation it may be joined
// with: what else went wrong.
func beyondCancel(err error) error {
	var rest []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !errors.Is(e, context.Canceled) {
				rest = append(rest, e)
			}
		}
		return errors.Join(rest...)
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// errSignalled is the cause of run's context once a signal stopped it
// before CMD ran.
var errSignalled = errors.New("stopped by a signal")

// relay decides what a signal to queenlock does: before CMD runs it stops
// the run (waiting or acquiring), while CMD runs it is passed on to CMD's
// process group, and after CMD has ended it is ignored, so the release is
// not cut short. Starting CMD and receiving a signal exclude each other, so
// no signal falls between the two.
type relay struct {
	mu       sync.Mutex
	pgid     int            // CMD's process group while it runs
	finished bool           // CMD has ended
	stopped  syscall.Signal // the signal that stopped the run before CMD ran
	term     chan struct{}  // a SIGTERM or SIGINT was passed on to CMD
}

func (r *relay) run(sigs <-chan os.Signal, cancel context.CancelCauseFunc, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case s := <-sigs:
			sig := s.(syscall.Signal)
			r.mu.Lock()
			switch {
			case r.pgid != 0:
				_ = syscall.Kill(-r.pgid, sig)
				if sig != syscall.SIGHUP {
					select {
					case r.term <- struct{}{}:
					default:
					}
				}
			case !r.finished && r.stopped == 0:
				r.stopped = sig
				cancel(fmt.Errorf("%w: %v", errSignalled, sig))
			}
			r.mu.Unlock()
		}
	}
}

// start starts cmd unless a signal has stopped the run.
func (r *relay) start(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped != 0 {
		return errSignalled
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.pgid = cmd.Process.Pid
	return nil
}

func (r *relay) finish() {
	r.mu.Lock()
	r.pgid, r.finished = 0, true
	r.mu.Unlock()
}

func (r *relay) stoppedBy() syscall.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

// supervise waits for cmd. When the lock is lost it sends the group SIGTERM;
// that, or a SIGTERM or SIGINT passed on to it (term), gives CMD grace to
// end before SIGKILL, so queenlock still releases the lock before whoever
// sent the signal gives up on it.
func supervise(lockCtx context.Context, cmd *exec.Cmd, grace time.Duration, term <-chan struct{}) int {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pgid := -cmd.Process.Pid
	var kill <-chan time.Time
	arm := func() {
		if kill == nil {
			kill = time.After(grace)
		}
	}
	lost := lockCtx.Done()
	for {
		select {
		case err := <-exited:
			return exitStatus(err)
		case <-term:
			arm()
		case <-lost:
			lost = nil
			_ = syscall.Kill(pgid, syscall.SIGTERM)
			arm()
		case <-kill:
			_ = syscall.Kill(pgid, syscall.SIGKILL)
		}
	}
}

func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return ExitError
	}
	return ExitOK
}
