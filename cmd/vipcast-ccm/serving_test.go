package main

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/names"
)

// TestStartMakesNoRSAKeys builds vipcast-ccm's serving configuration as a
// start does, with the flags the chart gives: the secure port serves a
// self-signed ECDSA certificate for localhost, and no webhook port (and no
// certificate for one) is set up. The cloud-provider app's defaults would
// make two RSA-2048 CAs and certificates for these, minutes of CPU on a
// starved small node.
func TestStartMakesNoRSAKeys(t *testing.T) {
	opts, err := newOptions()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	opts.SecureServing.Listener = ln
	opts.Generic.ClientConnection.Kubeconfig = writeKubeconfig(t)
	if err := useOwnServingCert(opts, t.TempDir(), time.Now()); err != nil {
		t.Fatal(err)
	}
	c, err := opts.Config(app.ControllerNames(controllers()), app.ControllersDisabledByDefault.List(), names.CCMControllerAliases(), app.AllWebhooks, app.DisabledByDefaultWebhooks)
	if err != nil {
		t.Fatal(err)
	}
	if opts.WebhookServing.BindPort != 0 || opts.WebhookServing.ServerCert.GeneratedCert != nil || c.WebhookSecureServing != nil {
		t.Errorf("webhook port %d has a certificate made at start (%v) or is served: vipcast has no webhook", opts.WebhookServing.BindPort, opts.WebhookServing.ServerCert.GeneratedCert != nil)
	}
	if c.SecureServing == nil || c.SecureServing.Cert == nil {
		t.Fatal("no serving certificate on the secure port")
	}
	certPEM, keyPEM := c.SecureServing.Cert.CurrentCertKeyContent()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pair.PrivateKey.(*ecdsa.PrivateKey); !ok {
		t.Errorf("the serving key is a %T, want an ECDSA key", pair.PrivateKey)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("localhost"); err != nil {
		t.Error(err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	if now := time.Now(); now.Before(cert.NotBefore) || now.After(cert.NotAfter) || cert.NotAfter.Sub(now) < 300*24*time.Hour {
		t.Errorf("the serving certificate is valid %s to %s", cert.NotBefore, cert.NotAfter)
	}
}

// TestOwnServingCertKeepsTheUsers: a certificate the user gives (files or
// --cert-dir) is used as given.
func TestOwnServingCertKeepsTheUsers(t *testing.T) {
	for name, set := range map[string]func(certFile, dir *string){
		"files":    func(certFile, _ *string) { *certFile = "/etc/vipcast/tls.crt" },
		"cert-dir": func(_, dir *string) { *dir = "/var/lib/vipcast" },
	} {
		t.Run(name, func(t *testing.T) {
			opts, err := newOptions()
			if err != nil {
				t.Fatal(err)
			}
			sc := &opts.SecureServing.ServerCert
			set(&sc.CertKey.CertFile, &sc.CertDirectory)
			before := *sc
			dir := t.TempDir()
			if err := useOwnServingCert(opts, dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			if sc.CertKey != before.CertKey || sc.CertDirectory != before.CertDirectory {
				t.Errorf("serving certificate changed from %+v to %+v", before.CertKey, sc.CertKey)
			}
			if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
				t.Errorf("wrote %v", files)
			}
		})
	}
}

// writeKubeconfig writes a kubeconfig for an API server nobody serves:
// building the configuration connects to none.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	const kc = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
