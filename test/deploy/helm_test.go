package deploy

import (
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	"sigs.k8s.io/yaml"
)

var chartDir = filepath.Join(root, "deploy/helm/sonde")

// nonDefault sets every value a user is likely to change.
const nonDefault = `
image: {repository: registry.example/sonde, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
imagePullSecrets: [{name: pull}]
otlp:
  endpoint: collector.observability.svc:4317
  tls: {secretName: sonde-tls}
frequency: 49
interval: 30s
filters:
  namespaces: [shop, payments]
  podSelector: "app.kubernetes.io/part-of=shop,tier!=batch"
metricsPort: 9100
logLevel: debug
config: {symbolize: symtab}
extraArgs: ["--timestamps"]
extraEnv: [{name: OTEL_RESOURCE_ATTRIBUTES, value: "deployment.environment.name=prod"}]
resources: {requests: {cpu: 100m, memory: 200Mi}, limits: {memory: 400Mi}}
tolerations: [{key: dedicated, operator: Equal, value: batch, effect: NoSchedule}]
nodeSelector: {kubernetes.io/os: linux, pool: general}
priorityClassName: system-node-critical
podAnnotations: {team: perf}
hostDebugPath: /usr/lib/debug
serviceAccount: {name: profiler, annotations: {note: x}}
`

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func values(t *testing.T, s string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// render is `helm template`: a client-only dry-run install.
func render(t *testing.T, vals map[string]any) (string, error) {
	t.Helper()
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: chartutil.DefaultCapabilities,
	}
	install := action.NewInstall(cfg)
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = "sonde", "monitoring"
	rel, err := install.Run(loadChart(t), vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

func TestHelmLint(t *testing.T) {
	for name, vals := range map[string]string{"default": "", "non-default": nonDefault, "debuginfod": `debuginfod: {urls: "https://d.example", headersSecret: auth}`} {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = "monitoring"
			res := lint.Run([]string{chartDir}, values(t, vals))
			for _, err := range res.Errors {
				t.Errorf("lint: %v", err)
			}
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				}
			}
		})
	}
}

func TestHelmTemplateDefault(t *testing.T) {
	manifest, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, "helm template", []byte(manifest))
	config := checkObjects(t, objs, "monitoring", 9464)
	for _, k := range []string{"otlp-endpoint", "k8s-namespaces", "k8s-pod-selector"} {
		if _, ok := config[k]; ok {
			t.Errorf("sonde.yaml sets %s by default", k)
		}
	}
	ds := find[*appsv1.DaemonSet](t, objs)
	if ds.Spec.Template.Spec.PriorityClassName != "" || len(ds.Spec.Template.Spec.Containers[0].Env) != 1 {
		t.Errorf("defaults: priority class %q, env %v: want none and NODE_NAME only", ds.Spec.Template.Spec.PriorityClassName, ds.Spec.Template.Spec.Containers[0].Env)
	}
}

func TestHelmTemplateNonDefault(t *testing.T) {
	manifest, err := render(t, values(t, nonDefault))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, "helm template", []byte(manifest))
	config := checkObjects(t, objs, "monitoring", 9100)
	want := map[string]any{
		"otlp-endpoint": "collector.observability.svc:4317", "frequency": float64(49), "interval": "30s",
		"k8s-namespaces": "shop,payments", "k8s-pod-selector": "app.kubernetes.io/part-of=shop,tier!=batch",
		"log-level": "debug", "symbolize": "symtab", "k8s-metadata": true,
	}
	for k, v := range want {
		if config[k] != v {
			t.Errorf("sonde.yaml %s = %v, want %v", k, config[k], v)
		}
	}
	ds := find[*appsv1.DaemonSet](t, objs)
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if c.Image != "registry.example/sonde@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
		t.Errorf("image %q", c.Image)
	}
	if spec.PriorityClassName != "system-node-critical" || spec.ServiceAccountName != "profiler" || spec.NodeSelector["pool"] != "general" {
		t.Errorf("priority class %q, service account %q, node selector %v", spec.PriorityClassName, spec.ServiceAccountName, spec.NodeSelector)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations %+v", spec.Tolerations)
	}
	if !slices.Contains(c.Args, "--timestamps") {
		t.Errorf("args %v lack the extra one", c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_CERTIFICATE":        "/etc/sonde/tls/ca.crt",
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/sonde/tls/tls.crt",
		"OTEL_EXPORTER_OTLP_CLIENT_KEY":         "/etc/sonde/tls/tls.key",
		"OTEL_RESOURCE_ATTRIBUTES":              "deployment.environment.name=prod",
	} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	if v := volumes["tls"]; v.Secret == nil || v.Secret.SecretName != "sonde-tls" {
		t.Errorf("tls volume %+v: want the secret sonde-tls", v)
	}
	if v := volumes["debug"]; v.HostPath == nil || v.HostPath.Path != "/usr/lib/debug" {
		t.Errorf("debug volume %+v: want the host's /usr/lib/debug", v)
	}
	if mem := c.Resources.Limits.Memory().String(); mem != "400Mi" {
		t.Errorf("memory limit %s, want 400Mi", mem)
	}
}

func TestHelmTemplateWithoutMetadata(t *testing.T) {
	manifest, err := render(t, values(t, "kubernetesMetadata: false"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decodeAll(t, "helm template", []byte(manifest)) {
		switch kind := o.GetObjectKind().GroupVersionKind().Kind; kind {
		case "ClusterRole", "ClusterRoleBinding":
			t.Errorf("%s rendered though kubernetesMetadata is off", kind)
		case "DaemonSet":
			if tok := o.(*appsv1.DaemonSet).Spec.Template.Spec.AutomountServiceAccountToken; tok == nil || *tok {
				t.Error("the service account token is mounted though kubernetesMetadata is off")
			}
		}
	}
	if _, err := render(t, values(t, "kubernetesMetadata: false\nfilters: {namespaces: [shop]}")); err == nil || !strings.Contains(err.Error(), "filters need kubernetesMetadata") {
		t.Errorf("filters without metadata: %v, want the chart to refuse", err)
	}
}

func find[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	for _, o := range objs {
		if o, ok := o.(T); ok {
			return o
		}
	}
	var zero T
	t.Fatalf("no %T rendered", zero)
	return zero
}

// With debuginfod servers, the chart passes them, mounts a writable state directory
// from the node for the cache and a headers Secret; without, neither.
func TestHelmTemplateDebuginfod(t *testing.T) {
	manifest, err := render(t, values(t, `debuginfod: {urls: "https://debuginfod.example https://b.example", cacheSize: 1GiB, headersSecret: dbg-auth}`))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, "helm template", []byte(manifest))
	config := checkObjects(t, objs, "monitoring", 9464)
	if config["debuginfod-cache-size"] != "1GiB" {
		t.Errorf("sonde.yaml debuginfod-cache-size = %v", config["debuginfod-cache-size"])
	}
	spec := find[*appsv1.DaemonSet](t, objs).Spec.Template.Spec
	c := spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range map[string]string{"DEBUGINFOD_URLS": "https://debuginfod.example https://b.example", "STATE_DIRECTORY": "/var/lib/sonde",
		"DEBUGINFOD_HEADERS_FILE": "/etc/sonde/debuginfod/headers", "SSL_CERT_FILE": "/etc/sonde/ca/ca.crt"} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	if m := mounts["state"]; m.MountPath != "/var/lib/sonde" || m.ReadOnly {
		t.Errorf("state mount %+v: want /var/lib/sonde, writable (the root file system is read-only)", m)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	if v := volumes["state"]; v.HostPath == nil || v.HostPath.Path != "/var/lib/sonde" || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("state volume %+v: want the node's /var/lib/sonde, created if missing", v)
	}
	if v := volumes["debuginfod-headers"]; v.Secret == nil || v.Secret.SecretName != "dbg-auth" {
		t.Errorf("headers volume %+v", v)
	}
	// The image has no CA certificates: https:// servers need the node's.
	if v := volumes["ca"]; v.HostPath == nil || v.HostPath.Path != "/etc/ssl/certs/ca-certificates.crt" || mounts["ca"].MountPath != env["SSL_CERT_FILE"] {
		t.Errorf("CA bundle volume %+v mounted at %q, SSL_CERT_FILE %q", v, mounts["ca"].MountPath, env["SSL_CERT_FILE"])
	}

	manifest, err = render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(manifest, "DEBUGINFOD") || strings.Contains(manifest, "/var/lib/sonde") || strings.Contains(manifest, "SSL_CERT_FILE") {
		t.Error("the default chart passes debuginfod settings or mounts the state directory")
	}
}
