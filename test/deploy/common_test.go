package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// root is the repository, two levels up from this module.
var root = func() string {
	p, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return p
}()

// wantCaps is the capability set sonde is deployed with, measured (deploy/README.md).
var wantCaps = []string{"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "SYSLOG"}

// strict decodes with client-go's scheme and fails on unknown or duplicate fields.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// decodeAll splits a multi-document YAML stream and decodes each non-empty document
// strictly.
func decodeAll(t *testing.T, name string, data []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufioReader(data))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, n, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s: document %d (%v): %v", name, n, gvk, err)
			continue
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// checkDaemonSet asserts the settings the issue asks of every way sonde is deployed.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, metricsPort int32, caps []string) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("hostPID is not set: sonde would see only its own processes")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no security context with capabilities")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged must be set, to false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem must be true")
	}
	if !slices.Equal(capNames(sc.Capabilities.Drop), []string{"ALL"}) {
		t.Errorf("capabilities dropped: %v, want ALL", sc.Capabilities.Drop)
	}
	if got := capNames(sc.Capabilities.Add); !slices.Equal(got, caps) {
		t.Errorf("capabilities added: %v, want %v", got, caps)
	}
	var port int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	if port != metricsPort {
		t.Errorf("metrics port %d, want %d", port, metricsPort)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/healthz" || probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: want GET /healthz on the metrics port", name, probe)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Error("no memory limit")
	}
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeName {
		t.Error("NODE_NAME does not come from spec.nodeName")
	}
	var cgroupRO bool
	for _, m := range c.VolumeMounts {
		cgroupRO = cgroupRO || m.MountPath == "/host/sys/fs/cgroup" && m.ReadOnly
	}
	if !cgroupRO {
		t.Error("the host's cgroup hierarchy is not mounted read-only at /host/sys/fs/cgroup")
	}
}

func capNames(cs []corev1.Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, strings.TrimPrefix(string(c), "CAP_"))
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
