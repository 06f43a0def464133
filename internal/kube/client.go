package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// APIConfig is how to reach the API server and whom to present there.
type APIConfig struct {
	Host string // https://host:port
	// The server's CA: a file, or PEM bytes; with neither, the system's roots.
	CAFile string
	CAData []byte
	// Insecure skips verifying the server's certificate (kubeconfig's
	// insecure-skip-tls-verify).
	Insecure   bool
	ServerName string
	// A bearer token, or a file holding one: the file is read again for each request,
	// as the kubelet rotates a projected service-account token in place.
	BearerToken     string
	BearerTokenFile string
	// A client certificate and key, as files (read at each handshake) or PEM bytes.
	CertFile, KeyFile string
	CertData, KeyData []byte
}

// The service account's files the kubelet mounts into every pod that has one.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	tokenFile         = serviceAccountDir + "/token"
	caFile            = serviceAccountDir + "/ca.crt"
)

// InClusterConfig is the pod's own service account: the API server's address from
// KUBERNETES_SERVICE_HOST and _PORT, the token and CA from the service-account mount.
func InClusterConfig() (*APIConfig, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	if _, err := os.Stat(tokenFile); err != nil {
		return nil, fmt.Errorf("service-account token: %w", err)
	}
	return &APIConfig{Host: "https://" + net.JoinHostPort(host, port), BearerTokenFile: tokenFile, CAFile: caFile}, nil
}

// apiError is a response other than 2xx, with the Status the API server sent where
// it sent one.
type apiError struct {
	Code    int
	Reason  string
	Message string
}

func (e *apiError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	if e.Reason != "" {
		return fmt.Sprintf("%s (%d %s)", msg, e.Code, e.Reason)
	}
	return fmt.Sprintf("%s (%d)", msg, e.Code)
}

// status is the API server's metav1.Status, as much of it as errors need.
type status struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// statusCode is the HTTP status an error carries, or 0.
func statusCode(err error) int {
	var e *apiError
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// isDenied reports a refusal of who sonde is or what it may do: 401 or 403.
func isDenied(err error) bool {
	c := statusCode(err)
	return c == http.StatusUnauthorized || c == http.StatusForbidden
}

// isGone reports a resource version the server no longer has (410): only a new list helps.
func isGone(err error) bool { return statusCode(err) == http.StatusGone }

// podClient lists and watches pods over the API server's REST interface, in JSON.
type podClient struct {
	base  *url.URL
	http  *http.Client
	cfg   APIConfig
	mu    sync.Mutex
	token string // the token file's last good content
}

// Bounds of one request. A list of one node's pods is small; a watch ends on the
// server's side after its timeoutSeconds, and on this side a while later should the
// connection die silently.
const (
	listTimeout  = time.Minute
	watchSeconds = 5 * 60
	watchSlack   = time.Minute
	// maxListBytes bounds a list as read: a pod is some kilobytes, a node's list some
	// megabytes.
	maxListBytes = 256 << 20
)

func newPodClient(cfg *APIConfig) (*podClient, error) {
	base, err := url.Parse(cfg.Host)
	if err != nil || base.Host == "" || (base.Scheme != "https" && base.Scheme != "http") {
		return nil, fmt.Errorf("API server %q: want https://host:port", cfg.Host)
	}
	tc := &tls.Config{InsecureSkipVerify: cfg.Insecure, ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12}
	if ca := cfg.CAData; len(ca) > 0 || cfg.CAFile != "" {
		if cfg.CAFile != "" {
			if ca, err = os.ReadFile(cfg.CAFile); err != nil {
				return nil, fmt.Errorf("API server CA: %w", err)
			}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, errors.New("API server CA: no PEM certificate")
		}
		tc.RootCAs = pool
	}
	if cfg.CertFile != "" || len(cfg.CertData) > 0 {
		// Loaded now to fail at start, and again at each handshake to follow rotation.
		load := func() (*tls.Certificate, error) {
			cert, key := cfg.CertData, cfg.KeyData
			var err error
			if cfg.CertFile != "" {
				if cert, err = os.ReadFile(cfg.CertFile); err != nil {
					return nil, err
				}
			}
			if cfg.KeyFile != "" {
				if key, err = os.ReadFile(cfg.KeyFile); err != nil {
					return nil, err
				}
			}
			c, err := tls.X509KeyPair(cert, key)
			return &c, err
		}
		if _, err := load(); err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: listTimeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	c := &podClient{base: base, http: &http.Client{Transport: tr}, cfg: *cfg}
	if cfg.BearerTokenFile != "" {
		if _, err := c.bearer(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// bearer returns the token to present: the file's content, or the last good one should
// the file be between versions.
func (c *podClient) bearer() (string, error) {
	if c.cfg.BearerTokenFile == "" {
		return c.cfg.BearerToken, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, err := os.ReadFile(c.cfg.BearerTokenFile)
	if t := strings.TrimSpace(string(b)); err == nil && t != "" {
		c.token = t
		return t, nil
	}
	if c.token != "" {
		return c.token, nil
	}
	if err == nil {
		err = errors.New("empty")
	}
	return "", fmt.Errorf("token file %s: %w", c.cfg.BearerTokenFile, err)
}

// get sends one GET for this node's pods in all namespaces; the caller closes the body.
func (c *podClient) get(ctx context.Context, q url.Values) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/pods"
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sonde")
	tok, err := c.bearer()
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &apiError{Code: resp.StatusCode}
	var s status
	if json.Unmarshal(body, &s) == nil && s.Message != "" {
		e.Reason, e.Message = s.Reason, s.Message
	} else if len(body) > 0 {
		e.Message = string(bytes.TrimSpace(body[:min(len(body), 512)]))
	}
	return nil, e
}

// podList is a PodList as sonde reads it.
type podList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []apiPod `json:"items"`
}

// List lists the pods the field selector chooses, from the server's watch cache
// (resourceVersion 0): a node's pods as of a moment, which the watch then follows.
func (c *podClient) List(ctx context.Context, fieldSelector string) (*podList, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, url.Values{"fieldSelector": {fieldSelector}, "resourceVersion": {"0"}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l podList
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxListBytes)).Decode(&l); err != nil {
		return nil, fmt.Errorf("decode pod list: %w", err)
	}
	return &l, nil
}

// event is one watch event. Object is a pod, or a Status for type ERROR.
type event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchStream is an open watch: Next returns its events until the server ends it.
type watchStream struct {
	body   io.ReadCloser
	dec    *json.Decoder
	cancel context.CancelFunc
}

// Watch follows the pods the field selector chooses from resourceVersion on, with
// bookmarks, until the server's timeout ends the stream.
func (c *podClient) Watch(ctx context.Context, fieldSelector, resourceVersion string) (*watchStream, error) {
	ctx, cancel := context.WithTimeout(ctx, watchSeconds*time.Second+watchSlack)
	resp, err := c.get(ctx, url.Values{
		"fieldSelector":       {fieldSelector},
		"resourceVersion":     {resourceVersion},
		"watch":               {"true"},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {strconv.Itoa(watchSeconds)},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return &watchStream{body: resp.Body, dec: json.NewDecoder(resp.Body), cancel: cancel}, nil
}

// Next returns the next event; io.EOF when the server ended the watch.
func (s *watchStream) Next() (event, error) {
	var e event
	err := s.dec.Decode(&e)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF // a stream cut between events is a stream ended: watch again
	}
	return e, err
}

func (s *watchStream) Close() {
	s.cancel()
	s.body.Close()
}
