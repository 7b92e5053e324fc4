package locks

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/queen-locks/queen-locks/api/v1alpha1"
)

var queenlocks = locksv1alpha1.GroupVersion.WithResource("queenlocks")

// WithDeletesOver sends deletes through d rather than the Client's
// controller-runtime client. A delete's answer tells a lock nothing (for a
// custom resource kube-apiserver sends a Status, not the object), yet
// controller-runtime decodes it, encodes it again and decodes that into a
// map; the dynamic client reads only whether it failed. The route uses it:
// a release is every other call it makes.
func WithDeletesOver(d dynamic.Interface) Option { return func(l *Client) { l.deletes = d } }

// delete deletes permit name in ns under the preconditions.
func (l *Client) delete(ctx context.Context, ns, name string, pre metav1.Preconditions) error {
	if l.deletes != nil {
		return l.deletes.Resource(queenlocks).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &pre})
	}
	return l.c.Delete(ctx, &locksv1alpha1.QueenLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.Preconditions(pre))
}
