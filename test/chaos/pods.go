package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/queen-locks/queen-locks/internal/route"
)

// With --auth=token each holder client runs "in" a pod of its own: a Pod
// object (no node runs it; nothing needs to) and a token bound to it, as
// the kubelet projects into a real pod. The route learns the pod from the
// token and records it as the permit's holderPod, and the nemesis deletes
// the holder's pod: the expiry controller must free the permit at once
// without ever freeing a lease that moved on.

// errNotApplicable is a fault that this run's setup cannot inject.
var errNotApplicable = errors.New("not applicable to this run")

// podName is the pod client id runs in.
func podName(id int) string { return fmt.Sprintf("client-%d", id) }

// startPods makes one pod and one pod-bound token file per holder client.
func (c *cluster) startPods(ctx context.Context, clients int) error {
	for id := range clients {
		c.podTokens = append(c.podTokens, filepath.Join(c.dir, fmt.Sprintf("client-%d.token", id)))
		c.podUIDs = append(c.podUIDs, "")
		if err := c.newPod(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// newPod creates client id's pod and writes a token bound to it, replacing
// the client's token file in one rename: the client reads it at every call.
func (c *cluster) newPod(ctx context.Context, id int) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: podName(id)},
		Spec: corev1.PodSpec{ServiceAccountName: ClientUser, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "client", Image: "chaos-client"}}},
	}
	pod, err := c.cs.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the pod of client %d: %w", id, err)
	}
	c.podUIDs[id] = pod.UID
	day := int64(24 * 3600)
	tr, err := c.cs.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, ClientUser, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{route.Audience}, ExpirationSeconds: &day,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token bound to the pod of client %d: %w", id, err)
	}
	tmp := c.podTokens[id] + ".new"
	if err := os.WriteFile(tmp, []byte(tr.Status.Token), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.podTokens[id])
}

// deletePod deletes client id's pod and starts it again: a new pod of the
// same name (another UID) with a new token, as a Deployment or a restarted
// Job would. A pod no node runs is deleted at once.
func (c *cluster) deletePod(ctx context.Context, id int) error {
	uid := c.podUIDs[id]
	c.rec.podGone(PodGone{Client: id, UID: string(uid), Call: time.Now().UnixNano()})
	err := c.cs.CoreV1().Pods(Namespace).Delete(ctx, podName(id), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the pod of client %d: %w", id, err)
	}
	return c.newPod(ctx, id)
}
