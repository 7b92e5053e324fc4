package election_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
	"github.com/queen-locks/queen-locks/election"
	"github.com/queen-locks/queen-locks/internal/controlplane"
	"github.com/queen-locks/queen-locks/permit"
)

var env *controlplane.Env

// The expiry controller is off: an expired permit stays until a candidate
// takes it over, so the takeover path is what the tests see. (With it on,
// the controller deletes the permit and the next candidate creates it.)
func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoExpiry: true}, func(e *controlplane.Env) { env = e }))
}

// Short leases, as whole seconds: client-go's record counts the lease in
// seconds, and a permit's ttlSeconds is at least one.
const (
	leaseDuration = 2 * time.Second
	renewDeadline = 1500 * time.Millisecond
	retryPeriod   = 250 * time.Millisecond
)

func newLock(t *testing.T, ns, name, identity string, opts ...election.Option) *election.Lock {
	t.Helper()
	l, err := election.New(env.Config, ns, name, identity, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// elector is one candidate running client-go's LeaderElector.
type elector struct {
	started, stopped chan struct{}
	done             chan struct{} // Run returned
	cancel           context.CancelFunc
	leaders          chan string // OnNewLeader
}

func run(t *testing.T, lock resourcelock.Interface, releaseOnCancel bool) *elector {
	t.Helper()
	e := &elector{started: make(chan struct{}), stopped: make(chan struct{}), done: make(chan struct{}), leaders: make(chan string, 100)}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		ReleaseOnCancel: releaseOnCancel, Name: lock.Describe(),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(e.started) },
			OnStoppedLeading: func() { close(e.stopped) },
			OnNewLeader: func(id string) {
				select {
				case e.leaders <- id:
				default:
				}
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		le.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	return e
}

// stop cancels the candidate and waits until its Run returned.
func (e *elector) stop() {
	e.cancel()
	<-e.done
}

func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("waiting for %s: nothing within a minute", what)
	}
}

// awaitTimeout is how long a test waits for something that must happen.
func awaitTimeout() <-chan time.Time { return time.After(time.Minute) }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// getPermit reads the permit of lock name as stored, or nil when none.
func getPermit(t *testing.T, ns, name string) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{}
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: permit.Name(name, 0)}, p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// holdAs makes owner hold lock name for ttl seconds, as another program
// (a candidate elsewhere) would.
func holdAs(t *testing.T, ns, name, owner string, ttl int64) *locksv1alpha1.QueenLock {
	t.Helper()
	p := &locksv1alpha1.QueenLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: permit.Name(name, 0)},
		Spec:       locksv1alpha1.QueenLockSpec{Lock: name, Limit: 1, Owner: owner, TTLSeconds: ttl},
	}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// counting counts the calls client-go makes on a lock.
type counting struct {
	resourcelock.Interface
	mu   sync.Mutex
	gets int
}

func (c *counting) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	c.mu.Lock()
	c.gets++
	c.mu.Unlock()
	return c.Interface.Get(ctx)
}

func (c *counting) Gets() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets
}
