package otlp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, cert tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestExporterMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCertFile, _, serverCert := selfSigned(t, dir, "server")
	clientCertFile, clientKeyFile, clientCert := selfSigned(t, dir, "client")
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(clientCert.Leaf)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeCollector{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clientCAs,
	})))
	collectorpb.RegisterProfilesServiceServer(srv, fc)
	go srv.Serve(lis)
	defer srv.Stop()

	cfg := testConfig("https://" + fc.addr)
	cfg.CertFile, cfg.ClientCert, cfg.ClientKey = serverCertFile, clientCertFile, clientKeyFile
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	e.Enqueue(request(0))
	waitFor(t, "delivery over mutual TLS", func() bool { return e.Stats().SentRequests == 1 })

	// Without the CA, the server's certificate is not trusted: nothing gets through.
	cfg.CertFile = ""
	bad, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, bad)
	bad.Enqueue(request(1))
	waitFor(t, "failed attempts", func() bool { return bad.Stats().FailedAttempts >= 2 })
	if s := bad.Stats(); s.SentRequests != 0 {
		t.Errorf("sent %d requests to an untrusted server", s.SentRequests)
	}
}
