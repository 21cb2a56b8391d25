// Command pause is the test node's pod sandbox program: it holds a pod's
// namespaces and waits for SIGTERM or SIGINT. The upstream pause image
// cannot be pulled here; this is built into an image by ociimage.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}
