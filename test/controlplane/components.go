package controlplane

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vipcast/vipcast/test/proc"
)

// APIPort is the API server's port on loopback.
func (cp *ControlPlane) APIPort() (int, error) {
	u, err := url.Parse(cp.apiURL)
	if err != nil {
		return 0, fmt.Errorf("API server URL %q: %w", cp.apiURL, err)
	}
	return strconv.Atoi(u.Port())
}

// ServingCA is the file holding the API server's self-signed serving
// certificate and the CA that signed it: the root CA in-cluster clients
// get (kube-root-ca.crt).
func (cp *ControlPlane) ServingCA() string {
	return filepath.Join(cp.Dir, "certs", "apiserver.crt")
}

// StartKubeControllers starts kube-controller-manager (every default
// controller: EndpointSlices, Deployments, DaemonSets, node lifecycle,
// service accounts and the root CA publisher; no cloud provider) and
// kube-scheduler beside the API server, as admin, with their logs in the
// control plane's directory. Stop stops them first. They need `make
// cluster-tools`.
func (cp *ControlPlane) StartKubeControllers() error {
	bin := BinDir()
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			return fmt.Errorf("%s not found in %s (run `make cluster-tools` to build it): %w", name, bin, err)
		}
	}
	ports, err := proc.FreePorts("127.0.0.1", 2)
	if err != nil {
		return err
	}
	kcm := append(cp.ComponentFlags(ports[0]),
		"--root-ca-file", cp.ServingCA(),
		"--service-account-private-key-file", filepath.Join(cp.Dir, "sa.key"),
		"--cluster-name", "lab",
		"--leader-elect=false",
		// --node-monitor-grace-period stays the default, 50 s, as in a
		// real cluster: test/lab's outage test freezes the API server
		// for longer, so that the controller marks the nodes unreachable
		// and their pods not ready when it returns.
		"--v", "1",
	)
	if err := cp.launch(filepath.Join(bin, "kube-controller-manager"), "kube-controller-manager", kcm...); err != nil {
		return err
	}
	sched := append(cp.ComponentFlags(ports[1]), "--leader-elect=false", "--v", "1")
	return cp.launch(filepath.Join(bin, "kube-scheduler"), "kube-scheduler", sched...)
}
