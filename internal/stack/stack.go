// Package stack starts the real components the bridge runs against: a
// kube-apiserver and etcd (controller-runtime envtest, with the binaries the
// Makefile builds) with the Student CRD installed, and an in-process NATS
// server with JetStream (or a cluster of three). `student-bridge dev`, the
// tests and the benchmark share it; what only tests need is in
// internal/stacktest, which the binary does not link.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/deploy"
	"github.com/student-bridge/student-bridge/internal/scheme"
)

// Options configure a Stack. The zero value is what tests want: random
// ports and temporary directories.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl. Default: the
	// KUBEBUILDER_ASSETS environment variable, else the repository's bin/.
	AssetsDir string
	// EtcdDataDir keeps the cluster's state across restarts; default is a
	// temporary directory removed on Stop.
	EtcdDataDir string
	// NATS configures the embedded NATS server.
	NATS NATSOptions
	// NATSCluster, if 2 or more, runs that many NATS servers in one
	// JetStream cluster instead of one server (NATS.Port is the first
	// one's client port, NATS.StoreDir holds their stores).
	NATSCluster int
	// APIServerFlags are extra kube-apiserver flags (name without dashes:
	// value), e.g. to turn the watch cache off.
	APIServerFlags map[string]string
	// FinalizerPolicy installs deploy/admission (the finalizer is added to
	// Students as they are created), as the default deployment does.
	FinalizerPolicy bool
}

// Stack is a running kube-apiserver + etcd + NATS.
type Stack struct {
	Env        *envtest.Environment
	RestConfig *rest.Config
	// Client is an admin client that knows the Student type.
	Client client.Client
	// NATS is the NATS server, or a cluster's first server.
	NATS *NATS
	// Cluster is the NATS cluster (Options.NATSCluster), or nil.
	Cluster *NATSCluster

	certDir string
}

// NATSURL is what a client of the stack's NATS is given: the server's URL,
// or every server's of the cluster.
func (s *Stack) NATSURL() string {
	if s.Cluster != nil {
		return s.Cluster.URL()
	}
	return s.NATS.URL()
}

// Start starts the control plane and NATS. Stop undoes everything, also
// when Start fails half-way.
func Start(opts Options) (*Stack, error) {
	assets, err := AssetsDir(opts.AssetsDir)
	if err != nil {
		return nil, err
	}
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDs:                  crds,
		ErrorIfCRDPathMissing: true,
	}
	if opts.EtcdDataDir != "" {
		if err := os.MkdirAll(opts.EtcdDataDir, 0o700); err != nil {
			return nil, err
		}
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: opts.EtcdDataDir}
	}
	// A fixed certificate directory survives an API server restart, so
	// clients keep trusting the restarted server (KillAPIServer).
	certDir, err := os.MkdirTemp("", "student-bridge-apiserver-")
	if err != nil {
		return nil, err
	}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	for name, value := range opts.APIServerFlags {
		env.ControlPlane.APIServer.Configure().Set(name, value)
	}
	s := &Stack{Env: env, certDir: certDir}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	s.RestConfig = cfg
	s.Client, err = client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		_ = s.Stop()
		return nil, err
	}
	if opts.FinalizerPolicy {
		if err := InstallFinalizerPolicy(s.RestConfig, s.Client, nil); err != nil {
			_ = s.Stop()
			return nil, err
		}
	}
	if opts.NATSCluster >= 2 {
		s.Cluster, err = StartNATSCluster(opts.NATSCluster, NATSClusterOptions{Port: opts.NATS.Port, StoreDir: opts.NATS.StoreDir})
		if err == nil {
			s.NATS = s.Cluster.Servers[0]
		}
	} else {
		s.NATS, err = StartNATS(opts.NATS)
	}
	if err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// ErrPolicyNotServed is returned where the API server serves no
// admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.35
// and older), so deploy/admission cannot be applied.
var ErrPolicyNotServed = errors.New("stack: the API server serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36 or later does)")

// ServesFinalizerPolicy reports whether the API server serves the kind of
// deploy/admission, as `make deploy` and the chart decide.
func ServesFinalizerPolicy(cfg *rest.Config) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	resources, err := dc.ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		return false, fmt.Errorf("discover admissionregistration.k8s.io/v1: %w", err)
	}
	for _, r := range resources.APIResources {
		if r.Kind == "MutatingAdmissionPolicy" {
			return true, nil
		}
	}
	return false, nil
}

// InstallFinalizerPolicy applies deploy/admission: a MutatingAdmissionPolicy
// that adds the bridge's finalizer to Students as they are created, and its
// binding; with namespaceLabels, the binding applies only to namespaces with
// those labels (as when a bridge watches only some namespaces). It returns
// once the API server applies the policy (a dry-run create gets the
// finalizer): policies take effect when the API server's informer sees them.
// It returns ErrPolicyNotServed where the API server cannot have it.
func InstallFinalizerPolicy(cfg *rest.Config, c client.Client, namespaceLabels map[string]string) error {
	served, err := ServesFinalizerPolicy(cfg)
	if err != nil {
		return err
	}
	if !served {
		return ErrPolicyNotServed
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := deploy.Admission.ReadFile("admission/finalizer.yaml")
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return fmt.Errorf("parse deploy/admission/finalizer.yaml: %w", err)
		}
		if u.GetKind() == "MutatingAdmissionPolicyBinding" && namespaceLabels != nil {
			if err := unstructured.SetNestedStringMap(u.Object, namespaceLabels, "spec", "matchResources", "namespaceSelector", "matchLabels"); err != nil {
				return err
			}
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("student-bridge-stack"), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	probeNS := metav1.NamespaceDefault
	if namespaceLabels != nil {
		probeNS = "student-bridge-policy-probe"
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probeNS, Labels: namespaceLabels}}
		if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	for {
		probe := &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Namespace: probeNS, Name: "finalizer-policy-probe"},
			Spec:       studentv1.StudentSpec{Name: "probe", School: "probe"},
		}
		err := c.Create(ctx, probe, client.DryRunAll)
		if err == nil && controllerutil.ContainsFinalizer(probe, studentv1.Finalizer) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the finalizer policy of deploy/admission did not take effect within a minute (last dry-run create: %v)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops NATS and the control plane.
func (s *Stack) Stop() error {
	var errs []error
	switch {
	case s.Cluster != nil:
		s.Cluster.Stop()
	case s.NATS != nil:
		s.NATS.Stop()
	}
	if s.Env != nil {
		if err := s.Env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop control plane: %w", err))
		}
	}
	if s.certDir != "" {
		_ = os.RemoveAll(s.certDir)
	}
	return errors.Join(errs...)
}

// AssetsDir finds the directory with kube-apiserver, etcd and kubectl.
func AssetsDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s (set KUBEBUILDER_ASSETS, or run `make control-plane` to build it): %w", b, dir, err)
		}
	}
	return dir, nil
}

// APIServerVersion is the Kubernetes minor version (e.g. 35 for v1.35.4) of
// the kube-apiserver in the assets directory dir, and its full version, as
// `kube-apiserver --version` prints it.
func APIServerVersion(dir string) (minor int, full string, err error) {
	dir, err = AssetsDir(dir)
	if err != nil {
		return 0, "", err
	}
	out, err := exec.Command(filepath.Join(dir, "kube-apiserver"), "--version").Output()
	if err != nil {
		return 0, "", fmt.Errorf("kube-apiserver --version: %w", err)
	}
	full = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes"))
	if _, err := fmt.Sscanf(full, "v1.%d.", &minor); err != nil {
		return 0, "", fmt.Errorf("kube-apiserver --version printed %q, no release (a binary built before the Makefile set its version: remove it and run make control-plane): %w", out, err)
	}
	return minor, full, nil
}

// RepoCommit is the commit of the repository at RepoRoot, "+dirty" if its
// tracked files have changes; "" outside a git checkout. A results file
// names its run with it.
func RepoCommit() string {
	return CommitAt(RepoRoot())
}

// CommitAt is RepoCommit of the checkout at root (a fresh clone a run was
// measured in, say).
func CommitAt(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += "+dirty"
	}
	return c
}

// RepoRoot is the repository this package was built from. A binary built
// with -trimpath (as the Makefile builds the programs it runs, see Build)
// knows this file only by its module path: then the repository is the
// working directory or the nearest one above it with the module's go.mod.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	if filepath.IsAbs(file) {
		return filepath.Join(filepath.Dir(file), "..", "..")
	}
	module := strings.TrimSuffix(filepath.ToSlash(file), "/internal/stack/stack.go")
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && ModulePath(mod) == module {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}

// ModulePath is the module a go.mod declares.
func ModulePath(mod []byte) string {
	for line := range strings.Lines(string(mod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// GoCommand is `go sub args...` in the repository, building as the
// Makefile builds the image's binary and every program it runs: static
// (CGO_ENABLED=0) and -trimpath. The module's dependencies are then
// compiled once in the Go build cache for all of them, and once more with
// -race for the tests themselves.
func GoCommand(sub string, args ...string) *exec.Cmd {
	cmd := exec.Command("go", append([]string{sub, "-trimpath"}, args...)...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// Build builds the module's package pkg (e.g. "./cmd/student-bridge")
// into the program out, with GoCommand.
func Build(out, pkg string) error {
	if b, err := GoCommand("build", "-o", out, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// CRDs parses the generated CRDs embedded from deploy/crd.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(deploy.CRDs, "crd/*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := deploy.CRDs.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(b, &kind); err != nil || kind.Kind != "CustomResourceDefinition" {
			continue // kustomization.yaml
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return nil, fmt.Errorf("parse %s: %w", f, err)
		}
		out = append(out, &crd)
	}
	if len(out) == 0 {
		return nil, errors.New("no CRD embedded from deploy/crd; run `make manifests`")
	}
	return out, nil
}

// NATSOptions configure the embedded NATS server.
type NATSOptions struct {
	// Host to listen on; default 127.0.0.1.
	Host string
	// Port to listen on; 0 picks a free port.
	Port int
	// StoreDir is JetStream's store; default a temporary directory removed on
	// Stop.
	StoreDir string
	// Configure, if set, adjusts the server options before start (auth, TLS,
	// limits) in tests.
	Configure func(*natsserver.Options)
}

// NATS is an embedded nats-server with JetStream.
type NATS struct {
	Server  *natsserver.Server
	opts    NATSOptions
	tempDir string
}

// StartNATS starts an embedded NATS server with JetStream.
func StartNATS(o NATSOptions) (*NATS, error) {
	n := &NATS{opts: o}
	if n.opts.Host == "" {
		n.opts.Host = "127.0.0.1"
	}
	if n.opts.Port == 0 {
		n.opts.Port = -1
	}
	if n.opts.StoreDir == "" {
		dir, err := os.MkdirTemp("", "student-bridge-nats-")
		if err != nil {
			return nil, err
		}
		n.tempDir, n.opts.StoreDir = dir, dir
	}
	if err := n.start(); err != nil {
		n.Stop()
		return nil, err
	}
	// Restarts keep the port, so clients reconnect to the same URL.
	n.opts.Port = n.Server.Addr().(*net.TCPAddr).Port
	return n, nil
}

func (n *NATS) start() error {
	so := &natsserver.Options{
		ServerName: "student-bridge-local",
		Host:       n.opts.Host,
		Port:       n.opts.Port,
		JetStream:  true,
		StoreDir:   n.opts.StoreDir,
		NoLog:      true,
		NoSigs:     true,
	}
	if n.opts.Configure != nil {
		n.opts.Configure(so)
	}
	srv, err := natsserver.NewServer(so)
	if err != nil {
		return fmt.Errorf("nats server: %w", err)
	}
	// NoLog keeps the server quiet; what it reports as an error is kept,
	// so that a server that never gets ready (a port another process
	// took) says why.
	errs := &serverErrors{}
	srv.SetLogger(errs, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats server: not ready for connections after 15s (%s)", errs)
	}
	n.Server = srv
	return nil
}

// serverErrors is a nats-server logger that keeps the last errors the
// server reported and drops everything else.
type serverErrors struct {
	mu   sync.Mutex
	last []string
}

func (l *serverErrors) keep(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = append(l.last, fmt.Sprintf(format, v...))
	if len(l.last) > 3 {
		l.last = l.last[1:]
	}
}

func (l *serverErrors) Fatalf(format string, v ...any) { l.keep(format, v...) }
func (l *serverErrors) Errorf(format string, v ...any) { l.keep(format, v...) }
func (l *serverErrors) Noticef(string, ...any)         {}
func (l *serverErrors) Warnf(string, ...any)           {}
func (l *serverErrors) Debugf(string, ...any)          {}
func (l *serverErrors) Tracef(string, ...any)          {}

func (l *serverErrors) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		return "it reported no error"
	}
	return "its last errors: " + strings.Join(l.last, "; ")
}

// URL is the client URL of the server.
func (n *NATS) URL() string { return n.Server.ClientURL() }

// Shutdown stops the server but keeps its store, so Restart resumes it.
func (n *NATS) Shutdown() {
	if n.Server != nil {
		n.Server.Shutdown()
		n.Server.WaitForShutdown()
	}
}

// Restart starts the server again on the same port with the same store.
func (n *NATS) Restart() error {
	n.Shutdown()
	return n.start()
}

// Stop shuts the server down and removes a temporary store.
func (n *NATS) Stop() {
	n.Shutdown()
	if n.tempDir != "" {
		_ = os.RemoveAll(n.tempDir)
	}
}

// NATSCluster is a JetStream cluster of embedded nats-servers with routes
// on loopback, each with a store of its own, as deploy/nats runs three.
// Every route runs through a Link, so a test can slow or cut the network
// between servers.
type NATSCluster struct {
	Servers []*NATS
	// links[i][j] carries the route server i dials to server j.
	links [][]*Link
}

// NATSClusterOptions configure StartNATSCluster.
type NATSClusterOptions struct {
	// Port is the first server's client port, the others' the ones after
	// it; 0 picks free ports.
	Port int
	// StoreDir holds each server's store in a directory of its name (n0,
	// n1, ...), kept on Stop; default temporary stores, removed on Stop.
	StoreDir string
}

// FreePorts returns the first of n consecutive ports nothing listens on,
// for servers to listen on soon: below the kernel's ephemeral range
// (32768 and up on Linux), so no outgoing connection of the tests running
// meanwhile takes one first.
func FreePorts(n int) (int, error) {
	for range 100 {
		base := 20000 + rand.IntN(12000-n)
		var ls []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free ports found below 32768", n)
}

// StartNATSCluster starts n servers named n0, n1, ... in one cluster and
// returns once JetStream has a meta leader. The route ports are picked
// free before the servers listen on them, and another process may take
// one meanwhile: then, unless o.Port fixes the ports, the cluster starts
// again on others, up to three times.
func StartNATSCluster(n int, o NATSClusterOptions) (*NATSCluster, error) {
	var errs []error
	for range 3 {
		c, err := startNATSCluster(n, o)
		if err == nil {
			return c, nil
		}
		if errs = append(errs, err); o.Port != 0 {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startNATSCluster(n int, o NATSClusterOptions) (*NATSCluster, error) {
	ports := make([]int, n)
	for i := range n {
		p, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	c := &NATSCluster{links: make([][]*Link, n)}
	for i := range n {
		c.links[i] = make([]*Link, n)
		for j := range n {
			if i == j {
				continue
			}
			l, err := NewLink(fmt.Sprintf("127.0.0.1:%d", ports[j]))
			if err != nil {
				c.Stop()
				return nil, err
			}
			c.links[i][j] = l
		}
	}
	for i := range n {
		var routes []*url.URL
		for j := range n {
			if i != j {
				routes = append(routes, &url.URL{Scheme: "nats", Host: c.links[i][j].Addr()})
			}
		}
		so := NATSOptions{}
		if o.Port != 0 {
			so.Port = o.Port + i
		}
		if o.StoreDir != "" {
			so.StoreDir = filepath.Join(o.StoreDir, c.name(i))
		}
		so.Configure = func(o *natsserver.Options) {
			o.ServerName = c.name(i)
			// Servers gossip a route address nobody listens on, so that
			// they reach each other only through the links.
			o.Cluster = natsserver.ClusterOpts{Name: "student-bridge-local", Host: "127.0.0.1", Port: ports[i], Advertise: "127.0.0.1:1"}
			o.Routes = routes
			// As deploy/nats runs them: acknowledge only what is on disk.
			o.SyncAlways = true
		}
		srv, err := StartNATS(so)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Servers = append(c.Servers, srv)
	}
	if err := c.WaitReady(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Links are the links that carry the routes to and from the server named
// name, both ways.
func (c *NATSCluster) Links(name string) []*Link {
	var out []*Link
	for i := range c.links {
		for j, l := range c.links[i] {
			if l != nil && (c.name(i) == name || c.name(j) == name) {
				out = append(out, l)
			}
		}
	}
	return out
}

// Kill stops the server named name as a crash would: its routes are cut
// first, so that it cannot hand its leaderships over on the way down, and
// its clients' connections end. Its store keeps what it synced, which with
// sync_interval always is everything it acknowledged. Kill returns the
// restart on that store.
func (c *NATSCluster) Kill(name string) (restart func() error, err error) {
	s, links := c.Server(name), c.Links(name)
	if s == nil {
		return nil, fmt.Errorf("no NATS server %s running", name)
	}
	for _, l := range links {
		l.Cut()
	}
	s.Shutdown()
	return func() error {
		for _, l := range links {
			l.Heal()
		}
		return s.Restart()
	}, nil
}

func (c *NATSCluster) name(i int) string { return fmt.Sprintf("n%d", i) }

// URL lists every server's client URL, comma separated, as a client of
// the cluster is given them.
func (c *NATSCluster) URL() string {
	var urls []string
	for _, s := range c.Servers {
		urls = append(urls, fmt.Sprintf("nats://%s:%d", s.opts.Host, s.opts.Port))
	}
	return strings.Join(urls, ",")
}

// Server is the running server named name, or nil.
func (c *NATSCluster) Server(name string) *NATS {
	for _, s := range c.Servers {
		if s.Server != nil && s.Server.Name() == name {
			return s
		}
	}
	return nil
}

// WaitReady waits until JetStream answers through every running server
// (the cluster has a meta leader and every server knows it) and can place
// a stream on each of them (the leader has their stats).
func (c *NATSCluster) WaitReady(timeout time.Duration) error {
	notCurrent := func() error {
		running, peers := 0, -1
		for _, s := range c.Servers {
			if s.Server == nil || !s.Server.Running() {
				continue
			}
			running++
			if !s.Server.JetStreamIsClustered() || !s.Server.JetStreamIsCurrent() {
				return fmt.Errorf("server %s: JetStream cluster not current yet", s.Server.Name())
			}
			if s.Server.JetStreamIsLeader() {
				peers = len(s.Server.JetStreamClusterPeers())
			}
		}
		// A stream is placed only on peers whose stats the meta leader
		// has: until then creating one of as many replicas fails ("no
		// suitable peers for placement").
		if peers < running {
			return fmt.Errorf("the meta leader knows %d of %d servers yet", max(peers, 0), running)
		}
		return nil
	}
	deadline := time.Now().Add(timeout)
	err := notCurrent()
	for ; err != nil && time.Now().Before(deadline); err = notCurrent() {
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Stop stops every server and link and removes the stores.
func (c *NATSCluster) Stop() {
	for _, s := range c.Servers {
		s.Stop()
	}
	for _, ls := range c.links {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	}
}
