package controlplane

import (
	"crypto/tls"
	"net/http"
)

// insecureTransport skips certificate checks: the test API server's
// certificate is self-signed and lives only for one test.
func insecureTransport() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // loopback test server
}
