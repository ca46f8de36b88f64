package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/cloud-provider/options"
)

// servingCertValidity is how long the self-signed serving certificate is
// valid: a year, as the cloud-provider app's own.
const servingCertValidity = 365 * 24 * time.Hour

// useOwnServingCert gives vipcast-ccm's secure port a self-signed
// certificate on an ECDSA P-256 key, written under dir, when the user gave
// neither --tls-cert-file/--tls-private-key-file nor --cert-dir. The
// cloud-provider app would make a CA and a certificate with two RSA-2048
// keys instead: a start pays for both, which takes well under a second on
// a server but minutes on a starved small node, past the startup probe's
// patience. The certificate is for localhost and 127.0.0.1, as the app's.
func useOwnServingCert(opts *options.CloudControllerManagerOptions, dir string, now time.Time) error {
	s := opts.SecureServing
	if s == nil || s.SecureServingOptions == nil || (s.BindPort == 0 && s.Listener == nil) {
		return nil
	}
	kc := &s.ServerCert.CertKey
	if kc.CertFile != "" || kc.KeyFile != "" || s.ServerCert.CertDirectory != "" {
		return nil
	}
	certPEM, keyPEM, err := selfSignedCert("localhost", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, now)
	if err != nil {
		return err
	}
	certFile, keyFile := filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("writing the self-signed serving key: %w", err)
	}
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return fmt.Errorf("writing the self-signed serving certificate: %w", err)
	}
	kc.CertFile, kc.KeyFile = certFile, keyFile
	return nil
}

// selfSignedCert returns a self-signed serving certificate for cn, dnsNames
// and ips, valid from an hour before now for servingCertValidity, and its
// ECDSA P-256 key, both PEM-encoded.
func selfSignedCert(cn string, dnsNames []string, ips []net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("generating a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", cn, now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(servingCertValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the serving key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
