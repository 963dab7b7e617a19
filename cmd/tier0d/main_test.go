package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeCert(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tier0 test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
	return cert, key
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	if tc, err := tlsConfig("", "", ""); tc != nil || err != nil {
		t.Fatalf("no flags: %v %v, want plain HTTP", tc, err)
	}
	if _, err := tlsConfig(cert, "", ""); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("cert without key: %v", err)
	}
	if _, err := tlsConfig("", "", cert); err == nil || !strings.Contains(err.Error(), "needs --tls-cert") {
		t.Fatalf("client CA alone: %v", err)
	}
	tc, err := tlsConfig(cert, key, "")
	if err != nil || len(tc.Certificates) != 1 || tc.ClientAuth != tls.NoClientCert {
		t.Fatalf("server TLS: %+v %v", tc, err)
	}
	tc, err = tlsConfig(cert, key, cert)
	if err != nil || tc.ClientAuth != tls.RequireAndVerifyClientCert || tc.ClientCAs == nil {
		t.Fatalf("mTLS: %+v %v", tc, err)
	}
	if _, err := tlsConfig(cert, key, key); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("client CA without a certificate: %v", err)
	}
}
