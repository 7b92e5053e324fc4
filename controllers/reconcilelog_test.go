package controllers_test

import (
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/queen-locks/queen-locks/controllers"
)

// A reconcile's lines carry the fields controller-runtime's default
// LogConstructor gives them (builder.doController: controller,
// controllerGroup, controllerKind, then the kind with the object's
// reference, namespace and name; the reconcileID controller-runtime adds),
// and name the line's caller, not the logger's own code.
func TestReconcileLinesCarryTheDefaultFields(t *testing.T) {
	var lines []map[string]any
	base := funcr.NewJSON(func(obj string) {
		var m map[string]any
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Errorf("line %s: %v", obj, err)
		}
		lines = append(lines, m)
	}, funcr.Options{LogCaller: funcr.All, Verbosity: 1})
	logs := controllers.ReconcileLogs(base, "queenlock-expiry", "locks.queen.dev", "QueenLock")

	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "report.0"}}
	log := logs(&req).WithValues("reconcileID", "r-1")
	log.V(5).Info("Reconciling") // not written: below the verbosity
	log.Info("permit expired", "lock", "report")
	log.V(1).Error(errors.New("boom"), "Reconciler error")
	logs(nil).Info("Starting Controller")

	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %v", len(lines), lines)
	}
	want := map[string]any{
		"controller": "queenlock-expiry", "controllerGroup": "locks.queen.dev", "controllerKind": "QueenLock",
		"QueenLock": map[string]any{"name": "report.0", "namespace": "team"}, "namespace": "team", "name": "report.0",
		"reconcileID": "r-1",
	}
	for i, line := range lines[:2] {
		for k, v := range want {
			if got, _ := json.Marshal(line[k]); string(got) != mustJSON(t, v) {
				t.Errorf("line %d: %s = %s, want %s", i, k, got, mustJSON(t, v))
			}
		}
		caller, _ := line["caller"].(map[string]any)
		if file, _ := caller["file"].(string); filepath.Base(file) != "reconcilelog_test.go" {
			t.Errorf("line %d: caller %v, want this test", i, line["caller"])
		}
	}
	if lines[0]["msg"] != "permit expired" || lines[0]["lock"] != "report" || lines[1]["error"] != "boom" {
		t.Errorf("the lines: %v", lines[:2])
	}
	if lines[2]["controller"] != "queenlock-expiry" || lines[2]["name"] != nil {
		t.Errorf("a line without a request: %v", lines[2])
	}
}

// The fields are added to the logger only when a line is written: a
// reconcile that writes none (almost all) adds none.
func TestReconcileLoggerAddsItsFieldsOnlyToALine(t *testing.T) {
	c := &countingSink{}
	logs := controllers.ReconcileLogs(logr.New(c), "queenlock-expiry", "locks.queen.dev", "QueenLock")
	c.withValues = 0 // the controller's own fields, once
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "report.0"}}
	log := logs(&req).WithValues("reconcileID", "r-1")
	log.V(5).Info("Reconciling")
	if c.withValues != 0 {
		t.Fatalf("%d additions of fields to the logger before any line, want none", c.withValues)
	}
	log.Info("permit expired")
	if c.withValues != 1 || c.lines != 1 {
		t.Fatalf("%d additions and %d lines for one line, want 1 and 1", c.withValues, c.lines)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// countingSink counts the additions of fields made to it and its lines.
type countingSink struct{ withValues, lines int }

func (c *countingSink) Init(logr.RuntimeInfo)          {}
func (c *countingSink) Enabled(level int) bool         { return level == 0 }
func (c *countingSink) Info(int, string, ...any)       { c.lines++ }
func (c *countingSink) Error(error, string, ...any)    { c.lines++ }
func (c *countingSink) WithValues(...any) logr.LogSink { c.withValues++; return c }
func (c *countingSink) WithName(string) logr.LogSink   { return c }
func (c *countingSink) WithCallDepth(int) logr.LogSink { return c }

// A reconcile's logger as the manager's zap logger makes it: the one
// controller-runtime's builder makes (builder.doController) against this
// package's, each with the reconcileID controller-runtime adds, no line
// written (as almost every reconcile of the expiry controller).
func BenchmarkReconcileLogger(b *testing.B) {
	base := crzap.New(crzap.WriteTo(io.Discard)).WithValues("controller", "queenlock-expiry",
		"controllerGroup", "locks.queen.dev", "controllerKind", "QueenLock")
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "report.0"}}
	b.Run("controller-runtime's default", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			log := base.WithValues("QueenLock", klog.KRef(req.Namespace, req.Name)).
				WithValues("namespace", req.Namespace, "name", req.Name).WithValues("reconcileID", types.UID("r-1"))
			log.V(5).Info("Reconciling")
		}
	})
	b.Run("reconcileLogs", func(b *testing.B) {
		logs := controllers.ReconcileLogs(crzap.New(crzap.WriteTo(io.Discard)), "queenlock-expiry", "locks.queen.dev", "QueenLock")
		b.ReportAllocs()
		for b.Loop() {
			log := logs(&req).WithValues("reconcileID", types.UID("r-1"))
			log.V(5).Info("Reconciling")
		}
	})
}
