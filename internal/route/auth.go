package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

// The route verifies callers' tokens and asks whether they may act; it
// never acts as them.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Audience is the audience a caller's token must carry, unless the
// operator names others.
const Audience = "queen-locks"

// MaxReviewTTL is the longest a TokenReview or SubjectAccessReview answer may
// be trusted: a deleted ServiceAccount or a revoked RoleBinding takes effect
// at the route within this time. DefaultReviewTTL leaves room below it for
// the API server's own caches to catch up.
const (
	MaxReviewTTL     = 10 * time.Second
	DefaultReviewTTL = 5 * time.Second
)

// refusalTTL is how long a refusal (a token not accepted, a right not
// granted) is remembered. It is short because a kube-apiserver that has just
// restarted can refuse for a moment what it grants once its caches have
// filled; a caller refused then is let in again within this time, while a
// caller that keeps being refused still costs at most one review per right
// per refusalTTL.
const refusalTTL = time.Second

// Caller is who sent a call. With AuthToken it is what the TokenReview of
// the caller's token said; with AuthNone it is empty.
type Caller struct {
	// Username, such as system:serviceaccount:team-a:nightly.
	Username string
	// Namespace of the caller's ServiceAccount; "" for other users.
	Namespace string
	// PodName and PodUID name the pod a pod-bound token was issued for;
	// "" for other tokens.
	PodName, PodUID string

	user user.Info // the whole identity, for SubjectAccessReviews
}

// callerOf reads a Caller from an authenticated user.
func callerOf(u user.Info) Caller {
	c := Caller{Username: u.GetName(), user: u}
	if ns, _, err := serviceaccount.SplitUsername(c.Username); err == nil {
		c.Namespace = ns
	}
	first := func(key string) string {
		if v := u.GetExtra()[key]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	c.PodName, c.PodUID = first(serviceaccount.PodNameKey), first(serviceaccount.PodUIDKey)
	return c
}

// verbs are the rights on queenlocks each operation needs. An acquire may
// take over an expired permit, which is an update, and whether it will is
// known only when it runs: both rights are checked before anything runs, so
// a call either is allowed whole or applies nothing.
var verbs = map[string][]string{
	OpAcquire: {"create", "update"},
	OpRenew:   {"update"},
	OpRelease: {"delete"},
	OpGet:     {"get"},
	OpCheck:   {"get"},
}

// reviews verifies tokens with TokenReviews and authorizes operations with
// SubjectAccessReviews, both cached for at most MaxReviewTTL.
type reviews struct {
	audiences authenticator.Audiences
	authn     authenticator.Request
	authz     authorizer.Authorizer
}

func newReviews(cs kubernetes.Interface, audiences []string, ttl, timeout time.Duration) (*reviews, error) {
	if len(audiences) == 0 {
		audiences = []string{Audience}
	}
	if ttl <= 0 || ttl > MaxReviewTTL {
		return nil, fmt.Errorf("the review cache TTL is %s: it must be above 0 and at most %s", ttl, MaxReviewTTL)
	}
	// One quick retry covers a blip; a longer outage answers 503 rather
	// than holding the caller's connection.
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 2}
	// Passing the audiences as the implicit ones matters only for a
	// TokenReview that answers none; the request context below carries them
	// too, so the API server checks the token against exactly these.
	tr, err := webhooktoken.NewFromInterface(cs.AuthenticationV1(), audiences, backoff, timeout, webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal: func(context.Context, string) {},
		RecordRequestLatency: func(ctx context.Context, code string, seconds float64) {
			reviewDuration.WithLabelValues(code).Observe(seconds)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the token authenticator: %w", err)
	}
	az, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             ttl,
		DenyCacheTTL:              min(ttl, refusalTTL),
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("creating the authorizer: %w", err)
	}
	return &reviews{
		audiences: audiences,
		// bearertoken takes the scheme in any case and removes the header
		// once the token is verified, so nothing later can forward it.
		authn: bearertoken.New(tokencache.New(tr, false, ttl, min(ttl, refusalTTL))),
		authz: az,
	}, nil
}

// errUnavailable marks a review the API server did not answer.
var errUnavailable = errors.New("the API server did not answer")

// authFailure is why a call was not authenticated: what the caller is told,
// and what the log is told.
type authFailure struct {
	code    int
	message string
	reason  string // metric label
	detail  error  // logged, never sent
	index   int    // the operation, or -1 for the call
}

// authenticate verifies the caller's bearer token. A failure says only what
// the caller needs to know; the API server's address and errors go to the
// log.
func (v *reviews) authenticate(r *http.Request) (Caller, *authFailure) {
	normalizeBearer(r.Header)
	ctx := authenticator.WithAudiences(r.Context(), v.audiences)
	resp, ok, err := v.authn.AuthenticateRequest(r.WithContext(ctx))
	switch {
	case ok:
		return callerOf(resp.User), nil
	case err == nil:
		return Caller{}, &authFailure{code: http.StatusUnauthorized, reason: "no_credentials", index: -1,
			message: "no credentials: send Authorization: Bearer <token>, a ServiceAccount token of audience " + v.audiences[0]}
	case unavailable(err):
		return Caller{}, &authFailure{code: http.StatusServiceUnavailable, reason: "unavailable", detail: err, index: -1,
			message: "could not verify the token: " + errUnavailable.Error() + "; try again"}
	default:
		return Caller{}, &authFailure{code: http.StatusUnauthorized, reason: "invalid_token", detail: err, index: -1,
			message: "token not valid for audience " + strings.Join(v.audiences, " or ")}
	}
}

// normalizeBearer rewrites "Bearer<spaces>token" with one space: RFC 9110
// lets a credential follow its scheme after one or more spaces, and the
// API machinery's bearer authenticator splits on a single one. The scheme
// is taken in any case. Anything else is left for the authenticator to
// refuse.
func normalizeBearer(h http.Header) {
	v := h.Get("Authorization")
	scheme, rest, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return
	}
	token := strings.TrimLeft(rest, " ")
	switch {
	case strings.ContainsAny(token, " \t\r\n"):
		// A credential is one token68: whatever follows a space is not
		// part of it, and the authenticator would ignore it. Refuse.
		h.Set("Authorization", scheme+" ")
	case token != rest:
		h.Set("Authorization", scheme+" "+token)
	}
}

// unavailable tells a TokenReview that did not happen (the API server did
// not answer, or refused the manager) from one that refused the token,
// whose error is a plain message. The webhook token authenticator of
// k8s.io/apiserver formats its retries' failure into a plain error too,
// so that one is told by its text.
func unavailable(err error) bool {
	var status apierrors.APIStatus
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &status) || errors.As(err, &uerr) || errors.As(err, &nerr) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		strings.HasPrefix(err.Error(), "webhook call failed")
}

// authorize asks, before any operation runs, whether the caller may do
// every operation of the call in ns. It answers the first right the caller
// lacks, naming the operation.
func (v *reviews) authorize(ctx context.Context, c Caller, ns string, ops []Operation) *authFailure {
	type need struct{ verb, op string }
	var needs []need
	index := map[string]int{}
	for i, op := range ops {
		for _, verb := range verbs[op.Op] {
			if _, ok := index[verb]; !ok {
				index[verb] = i
				needs = append(needs, need{verb, op.Op})
			}
		}
	}
	// Asked in the order of the operations, so a refused call always names
	// the first operation that lacks a right.
	for _, n := range needs {
		decision, _, err := v.authz.Authorize(ctx, authorizer.AttributesRecord{
			User:            c.user,
			Verb:            n.verb,
			Namespace:       ns,
			APIGroup:        locksv1alpha1.GroupVersion.Group,
			APIVersion:      locksv1alpha1.GroupVersion.Version,
			Resource:        "queenlocks",
			ResourceRequest: true,
		})
		i := index[n.verb]
		if err != nil {
			return &authFailure{code: http.StatusServiceUnavailable, reason: "unavailable", detail: err, index: i,
				message: fmt.Sprintf("operations[%d] (%s): could not authorize: %v; nothing was applied, try again", i, n.op, errUnavailable)}
		}
		if decision != authorizer.DecisionAllow {
			return &authFailure{code: http.StatusForbidden, reason: "forbidden", index: i,
				message: fmt.Sprintf("operations[%d] (%s): %s is forbidden to %s queenlocks.%s in namespace %q; nothing was applied",
					i, n.op, c.Username, n.verb, locksv1alpha1.GroupVersion.Group, ns)}
		}
	}
	return nil
}
