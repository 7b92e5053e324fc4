package route

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
)

// identity is who a bearer token belongs to, as the API server says.
type identity struct {
	username  string
	namespace string // the ServiceAccount's namespace, "" for other users
	expires   time.Time
}

// identityCache remembers, for a short while, who a token belongs to, so a
// caller that polls does not cost a SelfSubjectReview per call. Tokens are
// kept only as hashes.
type identityCache struct {
	mu  sync.Mutex
	ids map[[32]byte]identity
	ttl time.Duration
	max int
}

func newIdentityCache() *identityCache {
	return &identityCache{ids: map[[32]byte]identity{}, ttl: 30 * time.Second, max: 10000}
}

func (c *identityCache) lookup(ctx context.Context, cfg *rest.Config, hc *http.Client, token string) (identity, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	c.mu.Lock()
	id, ok := c.ids[key]
	c.mu.Unlock()
	if ok && now.Before(id.expires) {
		return id, nil
	}
	ac, err := authnclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return identity{}, err
	}
	review, err := ac.SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return identity{}, err
	}
	id = identity{username: review.Status.UserInfo.Username, expires: now.Add(c.ttl)}
	if rest, ok := strings.CutPrefix(id.username, "system:serviceaccount:"); ok {
		id.namespace, _, _ = strings.Cut(rest, ":")
	}
	c.mu.Lock()
	if len(c.ids) >= c.max {
		clear(c.ids) // bounded: a flood of distinct tokens costs reviews, not memory
	}
	c.ids[key] = id
	c.mu.Unlock()
	return id, nil
}
