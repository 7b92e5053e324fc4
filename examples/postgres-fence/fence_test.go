package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/queen-locks/queen-locks/handle"
	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	// No expiry controller: A's expired permit stays, so B takes it over
	// the way a waiting holder does.
	os.Exit(controlplane.TestMain(m, controlplane.Options{NoExpiry: true}, func(e *controlplane.Env) { env = e }))
}

// connect reaches the PostgreSQL that .ci/run starts (hack/postgres.sh).
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	dsn := os.Getenv("QUEEN_LOCKS_TEST_PGURL")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("QUEEN_LOCKS_TEST_PGURL is not set: .ci/run starts PostgreSQL for this test")
		}
		t.Skip("no PostgreSQL: run hack/postgres.sh and set QUEEN_LOCKS_TEST_PGURL")
	}
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	for _, q := range []string{`DROP TABLE IF EXISTS report`, Schema, `INSERT INTO report (id) VALUES (1)`} {
		if _, err := db.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

func TestAReplacedHolderChangesNoRow(t *testing.T) {
	ctx := context.Background()
	db := connect(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "pg-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tr := handle.Kube(env.Client, ns.Name)
	c := handle.New(tr)

	// A acquires and writes, then stops running (a GC pause, SIGSTOP): it
	// sends no renew, so it goes straight to the transport, and its lease
	// runs out while it believes it still holds the lock.
	a, err := tr.Acquire(ctx, "report-1", "a", 1, 1)
	if err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	tokenA := a.Token
	if ok, err := WriteReport(ctx, db, 1, "A, on time", tokenA); !ok || err != nil {
		t.Fatalf("A's write while holding: %v %v", ok, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return time.Now().After(a.ExpiresAt), nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// B takes over and writes twice under one token.
	b := c.Lock("report-1", 30*time.Second)
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return b.Acquire(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Release(ctx) }()
	if b.Token() <= tokenA {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), tokenA)
	}
	for _, body := range []string{"B, first", "B, second"} {
		if ok, err := WriteReport(ctx, db, 1, body, b.Token()); !ok || err != nil {
			t.Fatalf("B's write %q: %v %v", body, ok, err)
		}
	}
	// A wakes up and writes with the token it had: no row changes.
	if ok, err := WriteReport(ctx, db, 1, "A, late", tokenA); ok || err != nil {
		t.Fatalf("A's late write: written %v, %v", ok, err)
	}
	var body string
	var fence int64
	if err := db.QueryRow(ctx, `SELECT body, fence FROM report WHERE id = 1`).Scan(&body, &fence); err != nil {
		t.Fatal(err)
	}
	if body != "B, second" || uint64(fence) != b.Token() {
		t.Fatalf("row holds %q under fence %d; want B's second write under %d", body, fence, b.Token())
	}
}
