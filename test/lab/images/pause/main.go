// Command pause is the sandbox ("pause") image of the lab cluster's nodes:
// it holds a pod's namespaces, reaps the zombies that land on it as the
// pod's PID 1 when the pod shares its process namespace, and exits on
// SIGTERM or SIGINT. The lab builds it into an image without a registry
// (hack/image), as the upstream pause image is a registry download.
package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGCHLD)
	for s := range sigs {
		if s != unix.SIGCHLD {
			return
		}
		for {
			var ws unix.WaitStatus
			if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
