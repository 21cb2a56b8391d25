package node_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// The node's networks. They never leave the machine: the bridge has no
// route or NAT out, and what a pod sends elsewhere is dropped.
const (
	nodeName      = "sb-node"
	bridgeName    = "sbnode0"
	nodeIP        = "10.244.0.1"
	podCIDR       = "10.244.0.0/24"
	serviceCIDR   = "10.96.0.0/24"
	kubeServiceIP = "10.96.0.1"
	clusterDomain = "cluster.local"
	// iptablesChain holds the node's own rules (the drop of traffic that
	// would leave the machine), so teardown removes them as one.
	iptablesChain = "SB-NODE"
	// dirPrefix names the node's state directories; a run removes what an
	// earlier run that was killed left behind.
	dirPrefix = "sb-node-"
	// hostMarker marks a directory of the host's that a node of this tier
	// made, and so may remove.
	hostMarker = ".student-bridge-test-node"
)

// hostDirs are the directories kubelet, containerd and the CNI library
// use whatever they are configured with (kubelet's device plugins,
// containerd's shim sockets, the CNI result cache). The node makes them
// only where they are missing, marks them, and removes only marked ones:
// a machine's own runtime keeps its own.
var hostDirs = []string{"/var/lib/kubelet", "/run/containerd", "/var/lib/cni"}

// node is the real node: an API server and etcd (envtest), the
// controller-manager and scheduler, containerd with runc and the CNI
// bridge, kubelet, kube-proxy and CoreDNS, all as processes of this test.
type node struct {
	dir        string
	bin        string
	env        *envtest.Environment
	cfg        *rest.Config // the admin's, as kubeconfig holds it
	c          client.Client
	kubeconfig string
	procs      map[string]*proc
	sysctls    map[string]string
}

// proc is one of the node's processes, its output in dir/logs/<name>.log.
type proc struct {
	name string
	args []string
	env  []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// canRun says why the node tier cannot run here, or "" when it can.
func canRun(bin string) string {
	if os.Geteuid() != 0 {
		return "needs root (kubelet, containerd and the pod network)"
	}
	if err := syscall.Access("/sys/fs/cgroup/memory", 2); err != nil {
		return "needs writable cgroup v1 hierarchies: /sys/fs/cgroup/memory: " + err.Error()
	}
	for _, f := range []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager", "containerd", "containerd-shim-runc-v2", "ctr", "coredns", "kubectl", "helm",
		"images/student-bridge.tar", "images/nats.tar", "images/pause.tar", "images/student-bridge-previous.tar", "previous/src/deploy/helm/student-bridge/Chart.yaml"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			return "bin/" + f + " is missing (make tools image builds it)"
		}
	}
	for _, f := range []string{"/usr/bin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(f); err != nil {
			return f + " is missing (hack/node-packages.sh installs it)"
		}
	}
	for _, f := range []string{"iptables", "ip", "ss"} {
		if _, err := exec.LookPath(f); err != nil {
			return f + " is missing (hack/node-packages.sh installs it)"
		}
	}
	return ""
}

// startNode starts the node and waits until it is Ready with DNS and
// Services working. On an error, what it started is torn down.
func startNode(bin string) (n *node, err error) {
	cleanupStale()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	n = &node{dir: dir, bin: bin, procs: map[string]*proc{}, sysctls: map[string]string{}}
	defer func() {
		if err != nil {
			n.printLogs(os.Stderr)
			n.teardown()
			n = nil
		}
	}()
	for _, d := range []string{"logs", "pki", "etcd", "cni/net.d", "cni/ipam", "containerd", "kubelet", "pod-logs", "volumes"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return n, err
		}
	}
	for _, d := range hostDirs {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return n, err
			}
			if err := os.WriteFile(filepath.Join(d, hostMarker), nil, 0o644); err != nil {
				return n, err
			}
		}
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"pod network", n.startNetwork},
		{"API server", n.startAPIServer},
		{"controller-manager and scheduler", n.startControllers},
		{"containerd", n.startContainerd},
		{"kubelet", n.startKubelet},
		{"kube-proxy", n.startKubeProxy},
		{"CoreDNS", n.startCoreDNS},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.do(); err != nil {
			return n, fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Fprintf(os.Stderr, "node: %s up in %.1fs\n", s.name, time.Since(start).Seconds())
	}
	return n, nil
}

// run runs a command to its end and returns its combined output.
func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// setSysctl sets a sysctl, remembering the value to restore at teardown.
func (n *node) setSysctl(key, value string) error {
	p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	old, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if _, ok := n.sysctls[key]; !ok {
		n.sysctls[key] = strings.TrimSpace(string(old))
	}
	return os.WriteFile(p, []byte(value), 0o644)
}

func (n *node) startNetwork() error {
	for _, args := range [][]string{
		{"link", "add", bridgeName, "type", "bridge"},
		{"addr", "add", nodeIP + "/24", "dev", bridgeName},
		{"link", "set", bridgeName, "up"},
		// The host reaches Services through the bridge too: without a
		// route of their own their addresses would go to the default
		// route before kube-proxy's rules rewrite them.
		{"route", "add", serviceCIDR, "dev", bridgeName, "src", nodeIP},
	} {
		if _, err := run("ip", args...); err != nil {
			return err
		}
	}
	// Pods reach Services and each other through the host: forwarding on,
	// bridged traffic through iptables (kube-proxy's rules), and nothing
	// forwarded from the bridge anywhere but back into it.
	if err := n.setSysctl("net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if err := n.setSysctl("net.bridge.bridge-nf-call-iptables", "1"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-w", "-N", iptablesChain},
		{"-w", "-A", iptablesChain, "-i", bridgeName, "!", "-o", bridgeName, "-j", "DROP"},
		{"-w", "-A", iptablesChain, "-s", podCIDR, "!", "-d", podCIDR, "!", "-o", bridgeName, "-j", "DROP"},
		{"-w", "-I", "FORWARD", "1", "-j", iptablesChain},
	} {
		if _, err := run("iptables", args...); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "sb-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "hairpinMode": true,
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
    }
  ]
}
`, bridgeName, podCIDR, nodeIP, filepath.Join(n.dir, "cni/ipam"))
	return os.WriteFile(filepath.Join(n.dir, "cni/net.d/10-sb-node.conflist"), []byte(conf), 0o644)
}

// startAPIServer starts etcd and kube-apiserver through envtest, serving
// on the node's address with a certificate that also names the
// kubernetes Service, so pods' in-cluster clients trust it.
func (n *node) startAPIServer() error {
	pki := filepath.Join(n.dir, "pki")
	caPEM, err := writeCerts(pki)
	if err != nil {
		return err
	}
	port, err := stack.FreePorts(1)
	if err != nil {
		return err
	}
	api := &envtest.APIServer{CertDir: pki}
	api.SecureServing.ListenAddr.Address = nodeIP
	api.SecureServing.ListenAddr.Port = fmt.Sprint(port)
	api.SecureServing.CA = caPEM
	api.Configure().
		Set("advertise-address", nodeIP).
		Set("service-cluster-ip-range", serviceCIDR).
		Set("kubelet-preferred-address-types", "InternalIP").
		Set("service-account-issuer", "https://kubernetes.default.svc."+clusterDomain).
		// envtest turns ServiceAccount admission off; pods need their
		// tokens mounted.
		Disable("disable-admission-plugins")
	n.env = &envtest.Environment{
		BinaryAssetsDirectory: n.bin,
		ControlPlane:          envtest.ControlPlane{APIServer: api, Etcd: &envtest.Etcd{DataDir: filepath.Join(n.dir, "etcd")}},
	}
	if _, err := n.env.Start(); err != nil {
		return err
	}
	user, err := n.env.AddUser(envtest.User{Name: "sb-node-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	n.kubeconfig = filepath.Join(n.dir, "admin.kubeconfig")
	if err := os.WriteFile(n.kubeconfig, kc, 0o600); err != nil {
		return err
	}
	n.cfg = user.Config()
	n.cfg.QPS, n.cfg.Burst = 200, 400
	n.c, err = client.New(n.cfg, client.Options{Scheme: scheme.New()})
	return err
}

// writeCerts writes the API server's CA, serving certificate and service
// account key into pki and returns the CA.
func writeCerts(pki string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sb-node-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain},
		IPAddresses: []net.IP{net.ParseIP(nodeIP), net.ParseIP(kubeServiceIP), net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{
		"ca.crt":        caPEM,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
	for name, k := range map[string]*ecdsa.PrivateKey{"apiserver.key": key, "sa-signer.key": saKey} {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b})
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files["sa-signer.crt"] = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(pki, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

func (n *node) startControllers() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	if err := n.start("kube-controller-manager", nil, "--kubeconfig="+n.kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", ports[0]),
		"--root-ca-file="+filepath.Join(n.dir, "pki/ca.crt"),
		"--service-account-private-key-file="+filepath.Join(n.dir, "pki/sa-signer.key"),
		"--use-service-account-credentials=false", "--controllers=*,-nodeipam",
		"--cluster-cidr="+podCIDR, "--service-cluster-ip-range="+serviceCIDR,
		// Pods of a deleted node are not waited for: there is one node.
		"--node-monitor-grace-period=20s"); err != nil {
		return err
	}
	return n.start("kube-scheduler", nil, "--kubeconfig="+n.kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", ports[1]))
}

// containerdSock is containerd's socket; kubelet and ctr talk to it.
func (n *node) containerdSock() string { return filepath.Join(n.dir, "containerd/containerd.sock") }

func (n *node) startContainerd() error {
	d := filepath.Join(n.dir, "containerd")
	conf := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # root here lacks CAP_SYS_RESOURCE: without this, runc cannot lower a
  # container's oom_score_adj and every sandbox fails to start.
  restrict_oom_score_adj = true
  # The pods' network namespaces under the state directory, not
  # /run/netns: teardown finds what a killed run left.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %[4]q

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "student-bridge.test/pause:1"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.containerdSock(), filepath.Join(n.dir, "cni/net.d"))
	confPath := filepath.Join(d, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	if err := n.start("containerd", []string{"PATH=" + n.bin + ":/usr/sbin:/usr/bin:/sbin:/bin"}, "--config", confPath); err != nil {
		return err
	}
	if err := stacktest.Eventually(30*time.Second, func() error { _, err := os.Stat(n.containerdSock()); return err }); err != nil {
		return err
	}
	for _, img := range []string{"pause", "nats", "student-bridge", "student-bridge-previous"} {
		if err := n.importImage(filepath.Join(n.bin, "images", img+".tar")); err != nil {
			return err
		}
	}
	return nil
}

// importImage imports an image archive into the runtime's k8s.io
// namespace, where kubelet finds it.
func (n *node) importImage(archive string) error {
	_, err := run(filepath.Join(n.bin, "ctr"), "--address", n.containerdSock(), "-n", "k8s.io", "images", "import", "--local", archive)
	return err
}

func (n *node) startKubelet() error {
	d := filepath.Join(n.dir, "kubelet")
	resolv := filepath.Join(n.dir, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
clusterDNS:
- %[1]s
clusterDomain: %[3]s
resolvConf: %[4]s
podLogsDir: %[5]s
staticPodPath: ""
# The node's disk is the machine's: no eviction or image collection for
# what the rest of the machine uses.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
serializeImagePulls: false
maxPods: 60
podCIDR: %[6]s
`, nodeIP, n.containerdSock(), clusterDomain, resolv, filepath.Join(n.dir, "pod-logs"), podCIDR)
	confPath := filepath.Join(d, "config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	if err := n.start("kubelet", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, "--config="+confPath, "--kubeconfig="+n.kubeconfig,
		"--root-dir="+filepath.Join(d, "root"), "--cert-dir="+filepath.Join(d, "pki"), "--hostname-override="+nodeName, "--node-ip="+nodeIP, "--v=1"); err != nil {
		return err
	}
	return stacktest.Eventually(90*time.Second, func() error {
		var nd corev1.Node
		if err := n.c.Get(context.Background(), client.ObjectKey{Name: nodeName}, &nd); err != nil {
			return err
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status != corev1.ConditionTrue {
					return fmt.Errorf("node not Ready: %s", c.Message)
				}
				return nil
			}
		}
		return errors.New("node has no Ready condition yet")
	})
}

func (n *node) startKubeProxy() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	if err := n.start("kube-proxy", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, "--kubeconfig="+n.kubeconfig, "--hostname-override="+nodeName,
		"--proxy-mode=iptables", "--cluster-cidr="+podCIDR, "--conntrack-max-per-core=0",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", ports[0]), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[1])); err != nil {
		return err
	}
	return stacktest.Eventually(30*time.Second, func() error {
		_, err := run("iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES")
		return err
	})
}

// startCoreDNS runs cluster DNS on the node's address, which kubelet gives
// pods as their name server. It has no upstream: the machine has none.
func (n *node) startCoreDNS() error {
	corefile := filepath.Join(n.dir, "Corefile")
	conf := fmt.Sprintf(`%[2]s:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[1]s
    errors
    kubernetes %[2]s in-addr.arpa ip6.arpa {
        kubeconfig %[3]s
        pods insecure
        ttl 2
    }
}
# No upstream: every other name does not exist.
.:53 {
    bind %[1]s
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`, nodeIP, clusterDomain, n.kubeconfig)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		return err
	}
	if err := n.start("coredns", nil, "-conf", corefile); err != nil {
		return err
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, nodeIP+":53")
	}}
	return stacktest.Eventually(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		addrs, err := r.LookupHost(ctx, "kubernetes.default.svc."+clusterDomain)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0] != kubeServiceIP {
			return fmt.Errorf("kubernetes.default resolves to %v", addrs)
		}
		return nil
	})
}

// start starts one of the node's processes. Its death with this test's
// process is certain (Pdeathsig); its output goes to logs/<name>.log.
func (n *node) start(name string, env []string, args ...string) error {
	p := &proc{name: name, args: args, env: env, log: filepath.Join(n.dir, "logs", name+".log")}
	n.procs[name] = p
	return p.start(filepath.Join(n.bin, name))
}

func (p *proc) start(path string) error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return nil
}

// stop sends sig and waits up to grace for the process to end, then kills
// it.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// restart stops a process of the node with SIGTERM and starts it again with
// the same arguments.
func (n *node) restart(name string) error {
	p := n.procs[name]
	p.stop(syscall.SIGTERM, 20*time.Second)
	return p.start(filepath.Join(n.bin, name))
}

// teardown stops everything the node started and removes what it left:
// containers and their shims, mounts, network namespaces, iptables rules,
// cgroups, the bridge and the state directory. It runs even when the tests
// failed, and also cleans what a killed earlier run left (cleanupStale).
func (n *node) teardown() {
	for _, name := range []string{"coredns", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager"} {
		if p := n.procs[name]; p != nil {
			p.stop(syscall.SIGTERM, 10*time.Second)
		}
	}
	if p := n.procs["containerd"]; p != nil && p.cmd != nil {
		n.removeSandboxes()
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
	if n.env != nil {
		_ = n.env.Stop()
	}
	if p := n.procs["kube-proxy"]; p != nil {
		// kube-proxy's own cleanup removes its iptables chains.
		_, _ = run(filepath.Join(n.bin, "kube-proxy"), "--cleanup", "--proxy-mode=iptables")
	}
	cleanupStale()
	for k, v := range n.sysctls {
		_ = os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0o644)
	}
}

// removeSandboxes stops and removes every pod sandbox through the CRI, as
// kubelet would: the runtime kills the containers, the CNI plugins release
// the addresses and the veths, and the network namespaces go.
func (n *node) removeSandboxes() {
	conn, err := grpc.NewClient("unix://"+n.containerdSock(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, sb := range list.Items {
		_, _ = rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id})
		_, _ = rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id})
	}
}

// cleanupStale removes whatever a node of this tier left on the machine:
// processes started from a node directory, mounts below one, the network
// namespaces the runtime made, the bridge, the iptables chains, the pods'
// cgroups and the directories. It is idempotent.
func cleanupStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	killProcsUnder(dirs)
	unmountUnder(dirs)
	// The pods' veths: deleting the host end deletes the pair, even where
	// something still pins the pod's network namespace.
	if out, err := run("ip", "-o", "link", "show", "master", bridgeName); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				_, _ = run("ip", "link", "del", strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
			}
		}
	}
	_, _ = run("ip", "link", "del", bridgeName)
	if _, err := run("iptables", "-w", "-D", "FORWARD", "-j", iptablesChain); err == nil {
		_, _ = run("iptables", "-w", "-F", iptablesChain)
		_, _ = run("iptables", "-w", "-X", iptablesChain)
	}
	removeKubeChains()
	removeCgroups()
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
	for _, d := range hostDirs {
		if _, err := os.Stat(filepath.Join(d, hostMarker)); err == nil {
			unmountUnder([]string{d})
			_ = os.RemoveAll(d)
		}
	}
}

// killProcsUnder kills every process whose command line names one of dirs
// (the node's own processes, containerd's shims) and every process in a
// cgroup kubelet made for pods (kubepods), which outlives a killed shim.
func killProcsUnder(dirs []string) {
	entries, _ := os.ReadDir("/proc")
	self := fmt.Sprint(os.Getpid())
	var killed []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || e.Name() == self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cgroups, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		kill := bytes.Contains(cgroups, []byte(":/kubepods"))
		for _, d := range dirs {
			kill = kill || bytes.Contains(cmdline, []byte(d))
		}
		if kill {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = append(killed, pid)
		}
	}
	// Gone, or dead and waiting to be reaped (a zombie holds no mount),
	// before their mounts are detached.
	_ = stacktest.Eventually(10*time.Second, func() error {
		for _, pid := range killed {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if i := bytes.LastIndexByte(stat, ')'); err == nil && i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
				return fmt.Errorf("process %d still runs", pid)
			}
		}
		return nil
	})
}

// unmountUnder detaches every mount below dirs, the deepest first.
func unmountUnder(dirs []string) {
	if len(dirs) == 0 {
		return
	}
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		for _, d := range dirs {
			if strings.HasPrefix(f[1], d+"/") {
				mounts = append(mounts, f[1])
			}
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// removeKubeChains removes the iptables chains kube-proxy and the CNI
// plugins make, for a run whose kube-proxy could not clean up.
func removeKubeChains() {
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := run("iptables", "-w", "-t", table, "-S")
		if err != nil {
			continue
		}
		var chains []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "-N" && (strings.HasPrefix(f[1], "KUBE-") || strings.HasPrefix(f[1], "CNI-")) {
				chains = append(chains, f[1])
			}
			if len(f) >= 2 && f[0] == "-A" && (strings.Contains(line, "-j KUBE-") || strings.Contains(line, "-j CNI-")) {
				_, _ = run("iptables", append([]string{"-w", "-t", table, "-D"}, f[1:]...)...)
			}
		}
		for _, c := range chains {
			_, _ = run("iptables", "-w", "-t", table, "-F", c)
		}
		for _, c := range chains {
			_, _ = run("iptables", "-w", "-t", table, "-X", c)
		}
	}
}

// removeCgroups removes the cgroups kubelet made (kubepods), the deepest
// first, in every hierarchy.
func removeCgroups() {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods*")
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// printLogs prints the end of each process's log, for a failed start or
// test.
func (n *node) printLogs(w *os.File) {
	for name, p := range n.procs {
		b, err := os.ReadFile(p.log)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		fmt.Fprintf(w, "--- %s (last %d lines)\n%s\n", name, min(len(lines), 30), strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
}

// freePorts returns k consecutive free TCP ports.
func freePorts(k int) ([]int, error) {
	base, err := stack.FreePorts(k)
	if err != nil {
		return nil, err
	}
	ports := make([]int, k)
	for i := range ports {
		ports[i] = base + i
	}
	return ports, nil
}
