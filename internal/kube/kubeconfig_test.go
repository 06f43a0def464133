package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("config", `apiVersion: v1
kind: Config
current-context: b
clusters:
- name: one
  cluster: {server: "https://a.example:6443", certificate-authority-data: "Q0E="}
- name: two
  cluster: {server: "https://b.example:6443", certificate-authority: ca.crt}
users:
- name: u
  user: {tokenFile: token}
contexts:
- name: a
  context: {cluster: one, user: u}
- name: b
  context: {cluster: two, user: u}
`)
	cfg, err := LoadKubeconfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://b.example:6443" || cfg.CAFile != filepath.Join(dir, "ca.crt") || cfg.BearerTokenFile != filepath.Join(dir, "token") || cfg.CAData != nil {
		t.Errorf("current context b: host %q, CA file %q, token file %q, CA data %q", cfg.Host, cfg.CAFile, cfg.BearerTokenFile, cfg.CAData)
	}
	for name, content := range map[string]string{
		"no context":  "current-context: x\n",
		"no cluster":  "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n",
		"exec plugin": "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n",
		"bad base64":  "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x', certificate-authority-data: '%%'}}]\n",
		"not yaml":    "{{{",
	} {
		if _, err := LoadKubeconfig(write("bad", content)); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
			t.Errorf("%s: LoadKubeconfig = %v, want an error naming the kubeconfig", name, err)
		}
	}
}
