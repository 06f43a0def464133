package kube

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// kubeconfig is the part of a kubeconfig file sonde reads: its current context's
// server, CA and credentials. client-go's clientcmd reads all of it (exec plugins,
// merging of several files), at the price of more modules and megabytes in the agent,
// which needs a kubeconfig only when it runs outside a pod.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			TLSServerName            string `yaml:"tls-server-name"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
			Exec                  any    `yaml:"exec"`
			AuthProvider          any    `yaml:"auth-provider"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// LoadKubeconfig reads the current context of a kubeconfig file into an APIConfig.
// Credentials are a token, a token file (read again as it changes, like a projected
// service-account token) or a client certificate; exec and auth-provider plugins are
// refused rather than ignored, so a kubeconfig that needs them fails at start.
func LoadKubeconfig(path string) (*APIConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if kc.CurrentContext == "" {
		return nil, fmt.Errorf("kubeconfig %s: no current-context", path)
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: no context %q", path, kc.CurrentContext)
	}
	// Relative file names are relative to the kubeconfig, as kubectl reads them.
	rel := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(filepath.Dir(path), p)
		}
		return p
	}
	data := func(field, s string) ([]byte, error) {
		if s == "" {
			return nil, nil
		}
		d, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %s: %w", path, field, err)
		}
		return d, nil
	}
	cfg := &APIConfig{}
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cfg.Host = c.Cluster.Server
		cfg.CAFile = rel(c.Cluster.CertificateAuthority)
		cfg.Insecure = c.Cluster.InsecureSkipTLSVerify
		cfg.ServerName = c.Cluster.TLSServerName
		if cfg.CAData, err = data("certificate-authority-data", c.Cluster.CertificateAuthorityData); err != nil {
			return nil, err
		}
	}
	if !found || cfg.Host == "" {
		return nil, fmt.Errorf("kubeconfig %s: no server for cluster %q", path, clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		if u.User.Exec != nil || u.User.AuthProvider != nil {
			return nil, fmt.Errorf("kubeconfig %s: user %q needs a credential plugin, which sonde does not run: give it a token, token file or client certificate", path, userName)
		}
		cfg.BearerToken = u.User.Token
		cfg.BearerTokenFile = rel(u.User.TokenFile)
		cfg.CertFile = rel(u.User.ClientCertificate)
		cfg.KeyFile = rel(u.User.ClientKey)
		if cfg.CertData, err = data("client-certificate-data", u.User.ClientCertificateData); err != nil {
			return nil, err
		}
		if cfg.KeyData, err = data("client-key-data", u.User.ClientKeyData); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}
