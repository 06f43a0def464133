package kube

import (
	"bytes"
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// serverDir is the module the servers are built from.
var serverDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "server")
}()

// Binaries returns the paths of etcd and kube-apiserver, building them when the cache
// has none for this content of the server module. A build of kube-apiserver takes
// minutes on two cores, so it runs niced, once: later runs, and CI's clean clones on
// the same machine, find the binaries by the key.
func Binaries() (etcd, apiserver string, err error) {
	key, err := serverKey()
	if err != nil {
		return "", "", err
	}
	cache := os.Getenv("SONDE_KUBE_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Errorf("cache for the server binaries: %w", err)
		}
		cache = filepath.Join(base, "sonde", "kube")
	}
	dir := filepath.Join(cache, key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	var paths []string
	for _, name := range []string{"etcd", "kube-apiserver"} {
		out := filepath.Join(dir, name)
		paths = append(paths, out)
		if _, err := os.Stat(out); err == nil {
			continue
		}
		tmp := fmt.Sprintf("%s.tmp-%d", out, os.Getpid()) // two test runs may build at once
		// Without a symbol table and DWARF, which no test reads: the link of kube-apiserver
		// takes a third of the time.
		cmd := exec.Command("nice", "-n", "10", "go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "./"+name)
		cmd.Dir = serverDir
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("build %s: %w\n%s", name, err, b)
		}
		if err := os.Rename(tmp, out); err != nil {
			return "", "", err
		}
	}
	return paths[0], paths[1], nil
}

// serverKey hashes what the binaries are built from, and the Go release building them.
func serverKey() (string, error) {
	h := sha256.New()
	io.WriteString(h, runtime.Version())
	for _, f := range []string{"go.mod", "go.sum", "etcd/main.go", "kube-apiserver/main.go"} {
		b, err := os.ReadFile(filepath.Join(serverDir, f))
		if err != nil {
			return "", fmt.Errorf("server module: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Cluster is an etcd and a kube-apiserver on 127.0.0.1.
type Cluster struct {
	Dir        string
	Port       int    // the API server's secure port
	CA         []byte // PEM of the CA that signed the API server's certificate
	AdminToken string // a member of system:masters, from the token file
	AuditLog   string

	etcdURL              string
	etcd, server         *exec.Cmd
	etcdExit, serverExit <-chan error // closed once the process has exited
	etcdBin              string
	apiserverBin         string
	apiserverArgs        []string
	logs                 []*os.File
}

// Admin is a client config with every right.
func (c *Cluster) Admin() *rest.Config { return c.Config(c.AdminToken) }

// Config is a client config presenting token to the API server.
func (c *Cluster) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", c.Port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA},
		QPS:             -1, // the load test creates thousands of pods: no client-side limit
	}
}

// Kubeconfig writes a kubeconfig file presenting token to the API server and returns its
// path. With inFile, the token is in a file of its own that the kubeconfig names
// (tokenFile), as a projected service-account token is.
func (c *Cluster) Kubeconfig(name, token string, inFile bool) (string, error) {
	user := "token: " + token
	if inFile {
		if err := os.WriteFile(filepath.Join(c.Dir, name+".token"), []byte(token), 0o600); err != nil {
			return "", err
		}
		user = "tokenFile: " + name + ".token" // relative to the kubeconfig, as kubectl reads it
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: %s
  user:
    %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, c.Port, base64.StdEncoding.EncodeToString(c.CA), name, user, name)
	return path, os.WriteFile(path, []byte(content), 0o600)
}

// auditPolicy records who read pods, and how (the request URI carries the field
// selector); nothing else, so that the log stays small under load.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources: [{group: "", resources: ["pods"]}]
  verbs: ["get", "list", "watch"]
- level: None
`

// Start runs etcd and kube-apiserver in dir until Stop.
func Start(dir string) (*Cluster, error) {
	etcdBin, apiserverBin, err := Binaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, etcdBin: etcdBin, apiserverBin: apiserverBin, AuditLog: filepath.Join(dir, "audit.log")}
	if err := c.files(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.StartAPIServer(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// files writes the certificates, keys, token file and audit policy.
func (c *Cluster) files() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sonde-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("ca certificate: %w", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	c.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	// The service-account signing key; the API server takes the public key from it too.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		der, _ := x509.MarshalPKCS8PrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	token := make([]byte, 16)
	rand.Read(token)
	c.AdminToken = hex.EncodeToString(token)
	for name, content := range map[string][]byte{
		"ca.crt":        c.CA,
		"server.crt":    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"server.key":    keyPEM(srvKey),
		"sa.key":        keyPEM(saKey),
		"sa.pub":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv":    []byte(c.AdminToken + `,admin,admin-uid,"system:masters"` + "\n"),
		"audit.yaml":    []byte(auditPolicy),
		"etcd/.keep":    nil,
		"etcd.log":      nil,
		"apiserver.log": nil,
	} {
		p := filepath.Join(c.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, content, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) logFile(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(c.Dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		c.logs = append(c.logs, f)
	}
	return f, err
}

func (c *Cluster) startEtcd() error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	log, err := c.logFile("etcd.log")
	if err != nil {
		return err
	}
	c.etcd = exec.Command(c.etcdBin, "--name=test", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL, "--log-level=warn",
		// A test's data need not survive a crash of the machine.
		"--unsafe-no-fsync")
	c.etcd.Stdout, c.etcd.Stderr = log, log
	c.etcd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.etcd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	exited := watchExit(c.etcd)
	c.etcdExit = exited
	var failed error
	err = testenv.Wait("etcd to answer /health", time.Minute, func() (bool, string) {
		select {
		case err := <-exited:
			failed = fmt.Errorf("etcd exited: %v; %s", err, c.tail("etcd.log"))
			return true, ""
		default:
		}
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte(`"health":"true"`)), string(b)
	})
	return cmp.Or(failed, err)
}

// watchExit reports the exit of cmd, once.
func watchExit(cmd *exec.Cmd) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait(); close(ch) }()
	return ch
}

func (c *Cluster) tail(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, name))
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return string(b)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer: same port, same
// flags) and waits until /readyz says ok.
func (c *Cluster) StartAPIServer() error {
	if err := c.LaunchAPIServer(); err != nil {
		return err
	}
	return c.WaitAPIServer()
}

// LaunchAPIServer starts kube-apiserver without waiting for it.
func (c *Cluster) LaunchAPIServer() error {
	if c.apiserverArgs == nil {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.Port = port
		f := func(name string) string { return filepath.Join(c.Dir, name) }
		c.apiserverArgs = []string{
			"--etcd-servers=" + c.etcdURL,
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + f("certs"),
			"--tls-cert-file=" + f("server.crt"), "--tls-private-key-file=" + f("server.key"),
			"--client-ca-file=" + f("ca.crt"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + f("sa.pub"), "--service-account-signing-key-file=" + f("sa.key"),
			"--service-cluster-ip-range=10.0.0.0/24",
			"--authorization-mode=Node,RBAC",
			"--token-auth-file=" + f("tokens.csv"),
			"--audit-policy-file=" + f("audit.yaml"), "--audit-log-path=" + c.AuditLog,
			"--audit-log-mode=blocking",
			// sonde's DaemonSet uses the host's PID namespace and capabilities, as real
			// clusters allow.
			"--allow-privileged=true",
			// No Endpoints object for the kubernetes Service: none may point at loopback.
			"--endpoint-reconciler-type=none",
			// Without it, SIGTERM waits for open watches to end (minutes) before the
			// server exits; with it, they are closed after 2 s, as on clusters that
			// set it, and the clients' watches fail as in a restart.
			"--shutdown-watch-termination-grace-period=2s",
			"--profiling=false",
		}
	}
	log, err := c.logFile("apiserver.log")
	if err != nil {
		return err
	}
	c.server = exec.Command(c.apiserverBin, c.apiserverArgs...)
	c.server.Stdout, c.server.Stderr = log, log
	c.server.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.server.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	c.serverExit = watchExit(c.server)
	return nil
}

// WaitAPIServer waits until the API server LaunchAPIServer started says it is ready.
func (c *Cluster) WaitAPIServer() error {
	exited := c.serverExit
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.pool()}}, Timeout: 5 * time.Second}
	var failed error
	err := testenv.Wait("kube-apiserver's /readyz to say ok", 2*time.Minute, func() (bool, string) {
		select {
		case err := <-exited:
			failed = fmt.Errorf("kube-apiserver exited: %v; %s", err, c.tail("apiserver.log"))
			return true, ""
		default:
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/readyz", c.Port), nil)
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && string(b) == "ok", string(b)
	})
	return cmp.Or(failed, err)
}

func (c *Cluster) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(c.CA)
	return p
}

// StopAPIServer ends kube-apiserver as its supervisor would, with SIGTERM.
func (c *Cluster) StopAPIServer() {
	stop(c.server, c.serverExit)
	c.server = nil
}

func stop(cmd *exec.Cmd, exited <-chan error) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
	}
}

// Stop ends both servers.
func (c *Cluster) Stop() {
	c.StopAPIServer()
	stop(c.etcd, c.etcdExit)
	c.etcd = nil
	for _, f := range c.logs {
		f.Close()
	}
}

// etcdCall posts a JSON request to etcd's gRPC gateway.
func (c *Cluster) etcdCall(path string, req, resp any) error {
	b, _ := json.Marshal(req)
	r, err := http.Post(c.etcdURL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, r.Status, body)
	}
	if resp != nil {
		if err := json.Unmarshal(body, resp); err != nil {
			return fmt.Errorf("etcd %s: %w: %s", path, err, body)
		}
	}
	return nil
}

// Compact writes a key of its own to etcd, so that the revision moves past every
// resource version a client holds, and compacts etcd's history up to it: a watch from
// an older resource version then gets 410 Gone.
func (c *Cluster) Compact() (int64, error) {
	var put struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	enc := base64.StdEncoding.EncodeToString
	if err := c.etcdCall("/v3/kv/put", map[string]string{"key": enc([]byte("/sonde-test/bump")), "value": enc([]byte(time.Now().String()))}, &put); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(put.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd revision %q: %w", put.Header.Revision, err)
	}
	return rev, c.etcdCall("/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
}

// AuditEvent is what the tests read of an audit log entry.
type AuditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Audit returns the audit log's events of user (every user when "").
func (c *Cluster) Audit(user string) ([]AuditEvent, error) {
	b, err := os.ReadFile(c.AuditLog)
	if err != nil {
		return nil, err
	}
	var out []AuditEvent
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if user == "" || e.User.Username == user {
			out = append(out, e)
		}
	}
	return out, nil
}

// Proxy forwards TCP connections to the API server, and can cut them: a client's watch
// then fails while the API server goes on, as when a node loses its network.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool

	// FromServer and ToServer count the bytes forwarded, TLS included.
	FromServer, ToServer atomic.Int64
}

// NewProxy listens on 127.0.0.1 and forwards to the cluster's API server.
func (c *Cluster) NewProxy() (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: fmt.Sprintf("127.0.0.1:%d", c.Port), conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

// URL is where clients reach the API server through the proxy; the server's certificate
// holds for it (127.0.0.1).
func (p *Proxy) URL() string { return "https://" + p.l.Addr().String() }

func (p *Proxy) serve() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in] = true
		p.mu.Unlock()
		go p.forward(in)
	}
}

func (p *Proxy) forward(in net.Conn) {
	defer func() {
		in.Close()
		p.mu.Lock()
		delete(p.conns, in)
		p.mu.Unlock()
	}()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[out] = true
	p.mu.Unlock()
	defer func() {
		out.Close()
		p.mu.Lock()
		delete(p.conns, out)
		p.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	go func() { n, _ := io.Copy(out, in); p.ToServer.Add(n); done <- struct{}{} }()
	go func() { copyCounting(in, out, &p.FromServer); done <- struct{}{} }()
	<-done
}

// copyCounting copies as io.Copy does, counting as it goes: a watch's bytes are
// wanted while it is open.
func copyCounting(dst io.Writer, src io.Reader, n *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(int64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.l.Close()
	p.Cut()
}
