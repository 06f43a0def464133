package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// TestStrictDecoderRefusesUnknownFields shows the decoder the other tests rely on
// would catch a misspelt field.
func TestStrictDecoderRefusesUnknownFields(t *testing.T) {
	doc := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata: {}\nbogus: 1\n")
	if _, _, err := strict.Decode(doc, nil, nil); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("decoding a ConfigMap with an unknown field: %v, want an error naming it", err)
	}
}

// TestKubernetesManifests decodes every file of deploy/kubernetes strictly and checks
// the DaemonSet, the RBAC rules and the configuration.
func TestKubernetesManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "deploy/kubernetes/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	var objs []runtime.Object
	for _, f := range files {
		objs = append(objs, decodeAll(t, filepath.Base(f), readFile(t, f))...)
	}
	checkObjects(t, objs, "sonde", 9464)
}

// checkObjects checks the objects of one deployment of sonde, from the manifests or
// the chart.
func checkObjects(t *testing.T, objs []runtime.Object, namespace string, metricsPort int32) map[string]any {
	t.Helper()
	kinds := map[string]int{}
	var config map[string]any
	for _, o := range objs {
		kinds[o.GetObjectKind().GroupVersionKind().Kind]++
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			checkDaemonSet(t, o, metricsPort, wantCaps)
			if o.Namespace != namespace {
				t.Errorf("DaemonSet in namespace %q, want %q", o.Namespace, namespace)
			}
		case *rbacv1.ClusterRole:
			want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}
			if !slices.EqualFunc(o.Rules, want, func(a, b rbacv1.PolicyRule) bool {
				return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs) && len(a.ResourceNames) == 0 && len(a.NonResourceURLs) == 0
			}) {
				t.Errorf("ClusterRole rules %+v: want get, list and watch of pods only", o.Rules)
			}
		case *rbacv1.ClusterRoleBinding:
			if len(o.Subjects) != 1 || o.Subjects[0].Kind != "ServiceAccount" || o.Subjects[0].Namespace != namespace {
				t.Errorf("ClusterRoleBinding subjects %+v: want sonde's service account in %s", o.Subjects, namespace)
			}
		case *corev1.ConfigMap:
			if err := yaml.UnmarshalStrict([]byte(o.Data["sonde.yaml"]), &config); err != nil {
				t.Errorf("ConfigMap's sonde.yaml: %v", err)
			}
		}
	}
	for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} {
		if kinds[k] != 1 {
			t.Errorf("%d objects of kind %s, want 1 (all: %v)", kinds[k], k, kinds)
		}
	}
	if config == nil {
		t.Fatal("no sonde.yaml in a ConfigMap")
	}
	checkConfigWithSonde(t, config)
	if got, want := config["metrics-addr"], ":"+itoa(metricsPort); got != want {
		t.Errorf("metrics-addr %v, want %s", got, want)
	}
	return config
}

// checkConfigWithSonde has sonde itself read the configuration: every key must be a flag
// of sonde's and every value one it takes (--version stops after the flags are checked).
func checkConfigWithSonde(t *testing.T, config map[string]any) {
	t.Helper()
	data, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sonde.yaml")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "bin/sonde"), "--config", p, "--version").CombinedOutput()
	if err != nil {
		t.Errorf("sonde refuses the configuration deployed: %v\n%s\n%s", err, out, data)
	}
}

func itoa(n int32) string {
	b, _ := yaml.Marshal(n)
	return strings.TrimSpace(string(b))
}
