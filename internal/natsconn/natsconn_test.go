package natsconn_test

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
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natsconn"
	"github.com/student-bridge/student-bridge/internal/stack"
)

// secured starts an embedded NATS server configured by configure and returns
// its URL.
func secured(t *testing.T, configure func(*natsserver.Options)) string {
	t.Helper()
	n, err := stack.StartNATS(stack.NATSOptions{Configure: configure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return n.URL()
}

func natsConfig(t *testing.T, url string, auth config.Auth, tlsCfg config.TLS) config.NATS {
	t.Helper()
	c, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	n := c.NATS
	n.URLs, n.Auth, n.TLS = url, auth, tlsCfg
	n.ReconnectWait = 100 * time.Millisecond
	return n
}

func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNATSAuthentication: every credential kind the bridge supports works
// against a server that requires it, and a publish round-trips.
func TestNATSAuthentication(t *testing.T) {
	ca := newCA(t)
	serverCert := ca.issue(t, "server", false)
	clientCert := ca.issue(t, "client", true)

	userKP, _ := nkeys.CreateUser()
	userPub, _ := userKP.PublicKey()
	userSeed, _ := userKP.Seed()

	opJWT, accJWT, accPub, creds := operatorSetup(t)

	cases := []struct {
		name      string
		configure func(*natsserver.Options)
		auth      config.Auth
		tls       config.TLS
		scheme    string
	}{
		{"user and password file", func(o *natsserver.Options) { o.Username, o.Password = "bridge", "pw-123" },
			config.Auth{User: "bridge", PasswordFile: writeSecret(t, "pw", "pw-123\n")}, config.TLS{}, "nats"},
		{"token from environment", func(o *natsserver.Options) { o.Authorization = "tok-456" },
			config.Auth{Token: "tok-456"}, config.TLS{}, "nats"},
		{"token file", func(o *natsserver.Options) { o.Authorization = "tok-789" },
			config.Auth{TokenFile: writeSecret(t, "tok", "tok-789")}, config.TLS{}, "nats"},
		{"nkey seed file", func(o *natsserver.Options) { o.Nkeys = []*natsserver.NkeyUser{{Nkey: userPub}} },
			config.Auth{NkeySeedFile: writeSecret(t, "seed", string(userSeed))}, config.TLS{}, "nats"},
		{"JWT creds file", func(o *natsserver.Options) {
			o.TrustedOperators = []*jwt.OperatorClaims{opJWT}
			res := &natsserver.MemAccResolver{}
			if err := res.Store(accPub, accJWT); err != nil {
				t.Fatal(err)
			}
			o.AccountResolver = res
			o.JetStream = false
		}, config.Auth{CredsFile: writeSecret(t, "user.creds", creds)}, config.TLS{}, "nats"},
		{"TLS with server verification", func(o *natsserver.Options) { o.TLSConfig, o.TLS = serverCert.serverConfig(nil), true },
			config.Auth{}, config.TLS{CAFile: ca.file}, "tls"},
		{"mutual TLS", func(o *natsserver.Options) {
			o.TLSConfig, o.TLS, o.TLSVerify = serverCert.serverConfig(ca.pool), true, true
		}, config.Auth{}, config.TLS{CAFile: ca.file, CertFile: clientCert.certFile, KeyFile: clientCert.keyFile}, "tls"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := secured(t, tc.configure)
			url = strings.Replace(url, "nats://", tc.scheme+"://", 1)
			nc, err := natsconn.Connect(natsConfig(t, url, tc.auth, tc.tls), logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if !nc.IsConnected() {
				t.Fatalf("not connected: %s", nc.Status())
			}
			if err := nc.Publish("student.created", []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNATSRefusalsAreStartupErrors: refused credentials and an untrusted
// certificate stop the bridge with the cause; an unreachable server does not.
func TestNATSRefusalsAreStartupErrors(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	serverCert := ca.issue(t, "server", false)

	url := secured(t, func(o *natsserver.Options) { o.Username, o.Password = "bridge", "right" })
	_, err := natsconn.Connect(natsConfig(t, url, config.Auth{User: "bridge", PasswordFile: writeSecret(t, "pw", "wrong")}, config.TLS{}), logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("wrong password: %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error shows the password: %v", err)
	}

	tlsURL := strings.Replace(secured(t, func(o *natsserver.Options) { o.TLSConfig, o.TLS = serverCert.serverConfig(nil), true }), "nats://", "tls://", 1)
	_, err = natsconn.Connect(natsConfig(t, tlsURL, config.Auth{}, config.TLS{CAFile: other.file}), logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "certificate does not verify") {
		t.Errorf("untrusted certificate: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	nc, err := natsconn.Connect(natsConfig(t, "nats://"+addr, config.Auth{}, config.TLS{}), logr.Discard())
	if err != nil {
		t.Fatalf("unreachable server is an error instead of a retry: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() || nc.IsClosed() {
		t.Errorf("unreachable server: status %s, want reconnecting", nc.Status())
	}
}

func operatorSetup(t *testing.T) (*jwt.OperatorClaims, string, string, string) {
	t.Helper()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	oc, err = jwt.DecodeOperatorClaims(ojwt)
	if err != nil {
		t.Fatal(err)
	}
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Permissions.Pub.Allow.Add("student.>")
	uc.Permissions.Sub.Allow.Add("_INBOX.>")
	ujwt, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	return oc, ajwt, apub, string(creds)
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	file string
}

type testCert struct {
	pair              tls.Certificate
	certFile, keyFile string
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, file: writeSecret(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))}
}

func (ca *testCA) issue(t *testing.T, name string, client bool) *testCert {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &testCert{pair: pair, certFile: writeSecret(t, name+".pem", string(certPEM)), keyFile: writeSecret(t, name+"-key.pem", string(keyPEM))}
}

// serverConfig is the server's TLS config; with clientCAs it requires and
// verifies client certificates.
func (c *testCert) serverConfig(clientCAs *x509.CertPool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{c.pair}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		cfg.ClientCAs, cfg.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	return cfg
}
