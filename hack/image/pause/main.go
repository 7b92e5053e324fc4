// Command pause is the pod sandbox of make e2e's node: it holds the pod's
// namespaces open and does nothing else until it is told to stop. It stands
// in for registry.k8s.io/pause, which cannot be pulled here, and is built
// into an image by hack/image like the manager's.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
