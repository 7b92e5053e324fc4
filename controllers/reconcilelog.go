package controllers

import (
	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// reconcileLogs is a controller's LogConstructor that gives each reconcile
// the fields controller-runtime's default one gives (controller,
// controllerGroup, controllerKind, the object's kind with its reference,
// namespace and name; controller-runtime adds reconcileID), but adds them
// to the logger only when the reconcile writes a line. The default adds
// them at once, three times per reconcile (with reconcileID): each
// addition copies and encodes the logger's fields, about half of what the
// expiry controller spent per acquire and release (issue 45), where
// almost no reconcile writes a line.
func reconcileLogs(base logr.Logger, controller, group, kind string) func(*reconcile.Request) logr.Logger {
	base = base.WithValues("controller", controller, "controllerGroup", group, "controllerKind", kind)
	sink := base.GetSink()
	if sink == nil {
		return func(*reconcile.Request) logr.Logger { return base }
	}
	// lazySink's methods are one more frame between the caller and the
	// sink.
	if cd, ok := sink.(logr.CallDepthLogSink); ok {
		sink = cd.WithCallDepth(1)
	}
	return func(req *reconcile.Request) logr.Logger {
		if req == nil {
			return base
		}
		return logr.New(&lazySink{base: sink, kv: []any{
			kind, klog.KRef(req.Namespace, req.Name), "namespace", req.Namespace, "name", req.Name,
		}}).V(base.GetV())
	}
}

// lazySink is base with the values kv, added only when a line is written.
type lazySink struct {
	base logr.LogSink
	kv   []any
}

func (s *lazySink) Init(logr.RuntimeInfo) {} // base was, when it was made

func (s *lazySink) Enabled(level int) bool { return s.base.Enabled(level) }

func (s *lazySink) Info(level int, msg string, kv ...any) {
	s.base.WithValues(s.kv...).Info(level, msg, kv...)
}

func (s *lazySink) Error(err error, msg string, kv ...any) {
	s.base.WithValues(s.kv...).Error(err, msg, kv...)
}

func (s *lazySink) WithValues(kv ...any) logr.LogSink {
	return &lazySink{base: s.base, kv: append(s.kv[:len(s.kv):len(s.kv)], kv...)}
}

func (s *lazySink) WithName(name string) logr.LogSink {
	return &lazySink{base: s.base.WithValues(s.kv...).WithName(name)}
}

func (s *lazySink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.base.(logr.CallDepthLogSink); ok {
		return &lazySink{base: cd.WithCallDepth(depth), kv: s.kv}
	}
	return s
}
