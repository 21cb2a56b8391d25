// Package natsconn opens the NATS connection of the bridge and its
// commands: reconnection, authentication, TLS and the connection metrics.
// Secrets are never logged.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-bridge/student-bridge/internal/config"
)

var (
	natsConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_nats_connected",
		Help: "1 while the bridge is connected to NATS, 0 otherwise.",
	})
	natsReconnects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "student_bridge_nats_reconnects_total",
		Help: "Times the bridge reconnected to NATS.",
	})
	natsDisconnects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "student_bridge_nats_disconnects_total",
		Help: "Times the bridge lost its NATS connection.",
	})
)

var registerOnce sync.Once

// RegisterMetrics registers the NATS connection's metrics with controller-
// runtime's registry, the one the bridge's manager serves; once per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(natsConnected, natsReconnects, natsDisconnects, traffic)
	})
}

// traffic counts the messages the connections Connect opened sent and
// received (nats.Conn.Stats): what the bridge asks of NATS, in the units
// the server's own per-connection accounting (connz) counts.
var traffic = &trafficCollector{
	open: map[*nats.Conn]struct{}{},
	sent: prometheus.NewDesc("student_bridge_nats_messages_sent_total",
		"Messages the bridge sent to NATS: events, records, requests (an atomic batch of an event and its record is two).", nil, nil),
	received: prometheus.NewDesc("student_bridge_nats_messages_received_total",
		"Messages the bridge received from NATS: acknowledgements, replies, watched records and receipts.", nil, nil),
}

type trafficCollector struct {
	sent, received *prometheus.Desc

	mu   sync.Mutex
	open map[*nats.Conn]struct{}
	// closedOut and closedIn are what closed connections counted.
	closedOut, closedIn uint64
}

func (c *trafficCollector) add(nc *nats.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open[nc] = struct{}{}
}

func (c *trafficCollector) closed(nc *nats.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.open[nc]; ok {
		st := nc.Stats()
		c.closedOut, c.closedIn = c.closedOut+st.OutMsgs, c.closedIn+st.InMsgs
		delete(c.open, nc)
	}
}

func (c *trafficCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.sent; ch <- c.received }

func (c *trafficCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	out, in := c.closedOut, c.closedIn
	for nc := range c.open {
		st := nc.Stats()
		out, in = out+st.OutMsgs, in+st.InMsgs
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(out))
	ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(in))
}

// Connect connects to NATS as configured. An unreachable server is not an
// error: the connection keeps retrying in the background (publishes fail
// with sink.ErrNotConnected meanwhile and are retried). Refused credentials,
// untrusted certificates and unreadable credential files are errors.
func Connect(c config.NATS, log logr.Logger) (*nats.Conn, error) {
	auth, err := authOptions(c)
	if err != nil {
		return nil, err
	}
	opts := append(stateOptions(c, log), auth...)

	// A first attempt tells refused credentials and untrusted certificates,
	// which retrying cannot fix, from an unreachable server, which it can.
	nc, err := nats.Connect(c.URLs, opts...)
	if err == nil {
		traffic.add(nc)
		return nc, nil
	}
	if fatal := fatalConnectError(err); fatal != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", config.Redacted(c.URLs), fatal)
	}
	log.Info("NATS not reachable yet; retrying in the background", "urls", config.Redacted(c.URLs), "reason", err.Error(), "reconnectWait", c.ReconnectWait.String())
	nc, err = nats.Connect(c.URLs, append(opts, nats.RetryOnFailedConnect(true))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", config.Redacted(c.URLs), err)
	}
	traffic.add(nc)
	return nc, nil
}

// stateOptions configure reconnection and report the connection's state in
// the log and the metrics.
func stateOptions(c config.NATS, log logr.Logger) []nats.Option {
	return []nats.Option{
		nats.Name(c.Name),
		nats.Timeout(c.ConnectTimeout),
		nats.ReconnectWait(c.ReconnectWait),
		nats.MaxReconnects(c.MaxReconnects),
		// No reconnect buffer: a publish while disconnected fails at once
		// instead of sitting in a buffer that may never be flushed.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(nc *nats.Conn) {
			natsConnected.Set(1)
			log.V(1).Info("connected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			natsConnected.Set(0)
			natsDisconnects.Inc()
			log.Info("disconnected from NATS", "reason", fmt.Sprint(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			natsConnected.Set(1)
			natsReconnects.Inc()
			log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			natsConnected.Set(0)
			traffic.closed(nc)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error(err, "NATS error")
		}),
	}
}

// authOptions turn nats.auth.* and nats.tls.* into connection options,
// reading secrets from their files.
func authOptions(c config.NATS) ([]nats.Option, error) {
	var opts []nats.Option
	a := c.Auth
	password, err := secret(a.Password, a.PasswordFile, "nats.auth.passwordFile")
	if err != nil {
		return nil, err
	}
	token, err := secret(a.Token, a.TokenFile, "nats.auth.tokenFile")
	if err != nil {
		return nil, err
	}
	if a.User != "" {
		opts = append(opts, nats.UserInfo(a.User, password))
	}
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	if a.NkeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(a.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("config key nats.auth.nkeySeedFile: %w", err)
		}
		opts = append(opts, opt)
	}
	if a.CredsFile != "" {
		if _, err := os.ReadFile(a.CredsFile); err != nil {
			return nil, fmt.Errorf("config key nats.auth.credsFile: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if c.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.TLS.CAFile))
	}
	if c.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
	}
	return opts, nil
}

// fatalConnectError returns err, explained, if it is one that retrying will
// not fix: refused credentials or a certificate that does not verify.
func fatalConnectError(err error) error {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return fmt.Errorf("the server refused the credentials (check nats.auth.*): %w", err)
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("the server's TLS certificate does not verify (check nats.tls.caFile and the URL's host name): %w", err)
	case strings.Contains(err.Error(), "tls: "), strings.Contains(err.Error(), "secure connection"):
		return fmt.Errorf("TLS handshake failed (check nats.tls.*): %w", err)
	}
	return nil
}

func secret(value, file, key string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("config key %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}
