package testenv

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
	"testing"
	"time"
)

// PKI is a throwaway public-key infrastructure for TLS tests, made with
// crypto/x509 (no openssl) and written as PEM files in Dir: a CA, a server
// certificate it signs for 127.0.0.1 and localhost, a client certificate and
// an expired one for the same client name, and a second, unrelated CA.
// Keys are ECDSA P-256 in PKCS#8, which Go, OpenSSL (PostgreSQL) and Kafka's
// PEM key stores all read.
type PKI struct {
	Dir string
	// CA signs every certificate below.
	CA string
	// OtherCA is a CA that signed none of them: verifying with it fails
	// with "certificate signed by unknown authority".
	OtherCA string
	// ServerCert and ServerKey are valid for 127.0.0.1, ::1 and localhost.
	ServerCert, ServerKey string
	// ServerPEM is ServerKey followed by ServerCert and the CA (a Kafka PEM
	// key store holds the key and the chain in one file).
	ServerPEM string
	// ClientCert and ClientKey name ClientName as their common name (what
	// PostgreSQL's clientcert=verify-full and cert auth compare with the user).
	ClientCert, ClientKey string
	// ExpiredCert and ExpiredKey are a client certificate for ClientName that
	// expired an hour ago.
	ExpiredCert, ExpiredKey string
	ClientName              string
}

// NewPKI writes a PKI for clientName into a temporary directory removed at
// the end of the test. The files are world-readable except the keys (0600):
// a server that runs as another user needs its own copy (see
// PGOptions.Files).
func NewPKI(t testing.TB, clientName string) *PKI {
	t.Helper()
	p, err := newPKI(t.TempDir(), clientName)
	if err != nil {
		t.Fatalf("make the test PKI: %v", err)
	}
	return p
}

// Read returns a file of the PKI (for copying it where a server reads it).
func (p *PKI) Read(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newPKI(dir, clientName string) (*PKI, error) {
	p := &PKI{Dir: dir, ClientName: clientName}
	now := time.Now()
	ca, err := newCA("pgoutbox test CA", now)
	if err != nil {
		return nil, err
	}
	other, err := newCA("unrelated test CA", now)
	if err != nil {
		return nil, err
	}
	p.CA, p.OtherCA = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "other-ca.crt")
	if err := os.WriteFile(p.CA, ca.pem, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.OtherCA, other.pem, 0o644); err != nil {
		return nil, err
	}

	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	certPEM, keyPEM, err := ca.sign(server)
	if err != nil {
		return nil, err
	}
	p.ServerCert, p.ServerKey, err = writePair(dir, "server", certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	p.ServerPEM = filepath.Join(dir, "server.pem")
	if err := os.WriteFile(p.ServerPEM, append(append(keyPEM, certPEM...), ca.pem...), 0o600); err != nil {
		return nil, err
	}

	for _, c := range []struct {
		name                string
		notBefore, notAfter time.Time
		cert, key           *string
	}{
		{"client", now.Add(-time.Hour), now.Add(24 * time.Hour), &p.ClientCert, &p.ClientKey},
		{"expired", now.Add(-48 * time.Hour), now.Add(-time.Hour), &p.ExpiredCert, &p.ExpiredKey},
	} {
		certPEM, keyPEM, err := ca.sign(&x509.Certificate{
			Subject:     pkix.Name{CommonName: clientName},
			NotBefore:   c.notBefore,
			NotAfter:    c.notAfter,
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return nil, err
		}
		if *c.cert, *c.key, err = writePair(dir, c.name, certPEM, keyPEM); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func newCA(name string, now time.Time) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-72 * time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// sign issues tmpl with a new key and returns the certificate and the key
// (PKCS#8) in PEM.
func (ca *issuer) sign(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s: %w", tmpl.Subject.CommonName, err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

func writePair(dir, name string, certPEM, keyPEM []byte) (cert, key string, err error) {
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cert, certPEM, 0o644); err != nil {
		return "", "", err
	}
	// 0600: libpq refuses a key that others can read.
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}
