package dashboard_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/queen-locks/queen-locks/internal/dashboard"
	"github.com/queen-locks/queen-locks/internal/manager"
	"github.com/queen-locks/queen-locks/locks"
	"github.com/queen-locks/queen-locks/locks/waiters"
)

// A call that waits for a held lock shows on the page as a waiter of that
// lock, live, and goes when it stops waiting.
func TestStreamShowsTheLine(t *testing.T) {
	ns := env.Namespace(t, "dash-line")
	viewer := identity(t, ns, "viewer", map[string][]string{ns: {"queen-locks-viewer"}})
	s := serve(t, viewer, dashboard.Options{Namespace: ns})
	st := openStream(t, s)
	st.until("waiters live", func(m *model) bool { return m.sources["waiters"] == "live" })
	acquire(t, ns, "busy", "holder", 600)

	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = locks.New(wc, clock.RealClock{}).Acquire(ctx, ns, "busy", "patient", 600, 1, locks.WaitUpTo(time.Minute, waiters.Watcher{C: wc}))
	}()
	defer func() { cancel(); <-done }()
	// The row comes as an upsert, or in a reset when the watch was made
	// again meanwhile.
	var key string
	st.await("the waiter", func(e sse) bool {
		var rows []row
		switch e.Name {
		case "upsert":
			var u upsert
			if json.Unmarshal(e.Data, &u) != nil || u.Kind != "waiter" {
				return false
			}
			rows = []row{u.Row}
		case "reset":
			var r struct {
				Kind string
				Rows []row
			}
			if json.Unmarshal(e.Data, &r) != nil || r.Kind != "waiter" {
				return false
			}
			rows = r.Rows
		}
		for _, r := range rows {
			if r.Lock == "busy" && r.Owner == "patient" {
				key = "waiter:" + ns + "/" + r.Name
				return true
			}
		}
		return false
	})
	cancel()
	<-done
	st.await("the waiter leaving", func(e sse) bool {
		return e.Name == "delete" && strings.Contains(string(e.Data), `"key":"`+key+`"`)
	})
}
