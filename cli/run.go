package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/permit"
)

// runCmd is `queenlock run`: CMD runs only while this process holds the lock.
func runCmd(ctx context.Context, e Env, args []string) (int, error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var c common
	c.bind(fs)
	ttl := fs.Duration("ttl", 0, "lifetime of the lock, renewed every third of it while CMD runs (required)")
	limit := fs.Int("limit", 1, "run at most N at a time (a semaphore)")
	wait := fs.Duration("wait", 0, "wait up to this long for the lock instead of skipping at once")
	owner := fs.String("owner", "", "owner (default: host:pid:random)")
	heldCode := fs.Int("held-exit-code", 0, "exit status when the lock is held elsewhere and CMD is skipped")
	grace := fs.Duration("grace", 10*time.Second, "after SIGTERM on a lost lock, how long CMD has before SIGKILL")
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
	tokenFile := filepath.Join(dir, "token")
	h.OnRenew(func(token uint64) { _ = writeToken(tokenFile, token) })
	h.OnLost(func(reason string) {
		fmt.Fprintf(e.Stderr, "queenlock: lost the lock %q (%s); stopping the command\n", name, reason)
	})

	status := ExitOK
	acquired, err := h.Run(ctx, func(lockCtx context.Context) error {
		if err := writeToken(tokenFile, h.Token()); err != nil {
			return err
		}
		cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = e.Stdin, e.Stdout, e.Stderr
		cmd.Env = append(os.Environ(),
			"QUEEN_LOCK_NAME="+name,
			"QUEEN_LOCK_SLOT="+strconv.Itoa(h.Slot()),
			"QUEEN_LOCK_TOKEN="+strconv.FormatUint(h.Token(), 10),
			"QUEEN_LOCK_TOKEN_FILE="+tokenFile,
		)
		// Its own process group, so a lost lock stops CMD and its children.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting %s: %w", cmdArgs[0], err)
		}
		status = supervise(lockCtx, ctx, cmd, *grace)
		if errors.Is(context.Cause(lockCtx), handle.ErrLost) && status == ExitOK {
			status = ExitLost
		}
		return nil
	}, handle.Wait(*wait))
	if err != nil {
		return 0, err
	}
	if !acquired {
		fmt.Fprintf(e.Stderr, "queenlock: %q is %s elsewhere; not running the command\n", name, h.Reason())
		return *heldCode, nil
	}
	return status, nil
}

// supervise waits for cmd. When the lock is lost it sends the group SIGTERM,
// then SIGKILL after grace; signals to queenlock itself are passed on.
func supervise(lockCtx, ctx context.Context, cmd *exec.Cmd, grace time.Duration) int {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	pgid := -cmd.Process.Pid
	var kill <-chan time.Time
	lost := lockCtx.Done()
	for {
		select {
		case err := <-exited:
			return exitStatus(err)
		case s := <-sigs:
			_ = syscall.Kill(pgid, s.(syscall.Signal))
		case <-lost:
			lost = nil
			if ctx.Err() == nil || errors.Is(context.Cause(lockCtx), handle.ErrLost) {
				_ = syscall.Kill(pgid, syscall.SIGTERM)
				kill = time.After(grace)
			}
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

// writeToken replaces the token file whole, so a reader never sees half.
func writeToken(path string, token uint64) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(token, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
