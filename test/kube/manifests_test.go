package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// doc is one object of a manifest.
type doc struct {
	name      string // file and kind/name, for messages
	namespace string // where a namespaced object without one goes
	obj       *unstructured.Unstructured
}

// kindOrder applies what others need first, as kubectl apply of a directory would
// have to be told to.
var kindOrder = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"}

func rank(kind string) int {
	if i := slices.Index(kindOrder, kind); i >= 0 {
		return i
	}
	return len(kindOrder)
}

// manifestDocs reads every YAML file of dir.
func manifestDocs(t *testing.T, dir string) []doc {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("manifests in %s: %v", dir, err)
	}
	var docs []doc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, parseDocs(t, filepath.Base(f), "default", b)...)
	}
	slices.SortStableFunc(docs, func(a, b doc) int { return rank(a.obj.GetKind()) - rank(b.obj.GetKind()) })
	return docs
}

func parseDocs(t *testing.T, source, namespace string, data []byte) []doc {
	t.Helper()
	var docs []doc
	r := utilyaml.NewYAMLReader(bufioReader(data))
	for {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "{}" || s == "" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(j); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		docs = append(docs, doc{name: source + ": " + obj.GetKind() + "/" + obj.GetName(), namespace: namespace, obj: obj})
	}
	return docs
}

var (
	mapperOnce sync.Once
	mapper     meta.RESTMapper
	dyn        *dynamic.DynamicClient
)

// apply is kubectl apply --server-side, with --dry-run=server when dryRun is set: the
// API server decodes, defaults, validates and admits the object (and, without dryRun,
// stores it). Its refusal is returned as the server said it.
func apply(t *testing.T, c *Cluster, d doc, dryRun bool) error {
	t.Helper()
	mapperOnce.Do(func() {
		dc, err := discovery.NewDiscoveryClientForConfig(c.Admin())
		if err != nil {
			t.Fatal(err)
		}
		mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
		if dyn, err = dynamic.NewForConfig(c.Admin()); err != nil {
			t.Fatal(err)
		}
	})
	gvk := d.obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := d.obj.GetNamespace()
		if ns == "" {
			ns = d.namespace
		}
		ri = dyn.Resource(m.Resource).Namespace(ns)
	}
	opts := metav1.ApplyOptions{FieldManager: "sonde-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Apply(context.Background(), d.obj.GetName(), d.obj, opts)
	return err
}

// TestManifestsServerSide applies deploy/kubernetes as the server validates and admits
// it: each object first with a server-side dry-run, then for real (the later tests run
// as the ServiceAccount it makes).
func TestManifestsServerSide(t *testing.T) {
	c := cluster(t)
	for _, d := range manifestDocs(t, filepath.Join(root, "deploy/kubernetes")) {
		if err := apply(t, c, d, true); err != nil {
			t.Errorf("the API server refuses %s (dry run): %v", d.name, err)
			continue
		}
		if err := apply(t, c, d, false); err != nil {
			t.Errorf("the API server refuses %s: %v", d.name, err)
		}
	}
}

// TestHelmChartServerSide renders the chart as helm template does, with default and
// with non-default values, and dry-runs every object on the API server.
func TestHelmChartServerSide(t *testing.T) {
	c := cluster(t)
	ensureNamespace(t, adminClient(t, c), "monitoring")
	for name, vals := range map[string]string{"default": "", "non-default": helmNonDefault,
		"debuginfod": `debuginfod: {urls: "https://d.example", headersSecret: auth}`} {
		t.Run(name, func(t *testing.T) {
			manifest := renderChart(t, vals)
			docs := parseDocs(t, "helm template ("+name+")", "monitoring", []byte(manifest))
			if len(docs) == 0 {
				t.Fatal("the chart renders no object")
			}
			slices.SortStableFunc(docs, func(a, b doc) int { return rank(a.obj.GetKind()) - rank(b.obj.GetKind()) })
			for _, d := range docs {
				if err := apply(t, c, d, true); err != nil {
					t.Errorf("the API server refuses %s (dry run): %v", d.name, err)
				}
			}
		})
	}
}

// TestRejectedManifestFails checks the check: a DaemonSet the server refuses (an
// invalid container name; a field no schema declares) fails with the server's message,
// which decoding alone would not have given.
func TestRejectedManifestFails(t *testing.T) {
	c := cluster(t)
	var ds doc
	for _, d := range manifestDocs(t, filepath.Join(root, "deploy/kubernetes")) {
		if d.obj.GetKind() == "DaemonSet" {
			ds = d
		}
	}
	if ds.obj == nil {
		t.Fatal("deploy/kubernetes has no DaemonSet")
	}
	ensureNamespace(t, adminClient(t, c), ds.obj.GetNamespace())
	for what, change := range map[string]func(u map[string]any){
		"Invalid value": func(u map[string]any) {
			containers, _, _ := unstructured.NestedSlice(u, "spec", "template", "spec", "containers")
			containers[0].(map[string]any)["name"] = "Sonde_Agent"
			unstructured.SetNestedSlice(u, containers, "spec", "template", "spec", "containers")
		},
		"field not declared in schema": func(u map[string]any) {
			unstructured.SetNestedField(u, true, "spec", "template", "spec", "hostPIDs")
		},
	} {
		bad := doc{name: ds.name, namespace: ds.namespace, obj: ds.obj.DeepCopy()}
		change(bad.obj.Object)
		err := apply(t, c, bad, true)
		t.Logf("the server on %s: %v", what, err)
		if err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("a DaemonSet with %q: apply = %v, want the server's refusal", what, err)
		}
	}
}

// helmNonDefault sets the values a user is likely to change (as test/deploy does).
const helmNonDefault = `
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

// renderChart is helm template: a client-only dry-run install into "monitoring".
func renderChart(t *testing.T, vals string) string {
	t.Helper()
	values := map[string]any{}
	if err := yaml.Unmarshal([]byte(vals), &values); err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(filepath.Join(root, "deploy/helm/sonde"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: chartutil.DefaultCapabilities,
	}
	install := action.NewInstall(cfg)
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = "sonde", "monitoring"
	rel, err := install.Run(ch, values)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return rel.Manifest
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
