package kube

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// root is the sonde repository.
var root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "../..")
}()

const (
	// Each test has a node of its own: pods of one test are other nodes' pods to the
	// watchers of the others.
	thisNode    = "node-a"
	otherNode   = "node-b"
	e2eNode     = "node-e2e"
	restartNode = "node-restart"
	loadNode    = "node-load"
	// The ServiceAccount deploy/kubernetes makes for the DaemonSet.
	sondeNamespace = "sonde"
	sondeAccount   = "sonde"
	sondeUser      = "system:serviceaccount:" + sondeNamespace + ":" + sondeAccount
)

var (
	clusterOnce sync.Once
	shared      *Cluster
	clusterErr  error
	clusterDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	if clusterDir != "" && code == 0 {
		os.RemoveAll(clusterDir)
	} else if clusterDir != "" {
		fmt.Fprintf(os.Stderr, "servers' logs and audit log kept in %s\n", clusterDir)
	}
	os.Exit(code)
}

// cluster starts the servers the first time a test asks, and gives every test the same
// ones: starting takes seconds, building them minutes the first time.
func cluster(t *testing.T) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Unavailable(t, "the servers are built with go, not on PATH")
	}
	clusterOnce.Do(func() {
		clusterDir, clusterErr = os.MkdirTemp("", "sonde-kube-")
		if clusterErr != nil {
			return
		}
		start := time.Now()
		shared, clusterErr = Start(clusterDir)
		if clusterErr == nil {
			t.Logf("etcd and kube-apiserver ready in %v (%s)", time.Since(start).Round(time.Millisecond), clusterDir)
		}
	})
	if clusterErr != nil {
		t.Fatalf("servers: %v", clusterErr)
	}
	return shared
}

func adminClient(t *testing.T, c *Cluster) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

var manifestsOnce sync.Once

// sondeToken applies deploy/kubernetes (once) and returns a token the API server issues
// for sonde's ServiceAccount, as the kubelet would project into sonde's pod.
func sondeToken(t *testing.T, c *Cluster) string {
	t.Helper()
	manifestsOnce.Do(func() {
		for _, doc := range manifestDocs(t, filepath.Join(root, "deploy/kubernetes")) {
			if err := apply(t, c, doc, false); err != nil {
				t.Fatalf("apply %s: %v", doc.name, err)
			}
		}
	})
	cs := adminClient(t, c)
	tr, err := cs.CoreV1().ServiceAccounts(sondeNamespace).CreateToken(context.Background(), sondeAccount,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", sondeUser, err)
	}
	return tr.Status.Token
}

func ptr[T any](v T) *T { return &v }

// ensureNamespace makes a namespace and its default ServiceAccount: no controller
// manager runs to make the account, and the ServiceAccount admission plugin refuses
// pods without it.
func ensureNamespace(t *testing.T, cs *kubernetes.Clientset, name string) {
	t.Helper()
	ctx := context.Background()
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s: %v", name, err)
	}
	_, err = cs.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("default service account of %s: %v", name, err)
	}
}

func ensureNodes(t *testing.T, cs *kubernetes.Clientset, names ...string) {
	t.Helper()
	for _, n := range names {
		_, err := cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("node %s: %v", n, err)
		}
	}
}

// workload is a Deployment and the ReplicaSet it would make, as the controller manager
// (which does not run here) names and labels them.
type workload struct {
	namespace, deployment, hash string
	rs                          *appsv1.ReplicaSet
}

func makeWorkload(t *testing.T, cs *kubernetes.Clientset, namespace, deployment, hash string) workload {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app.kubernetes.io/name": deployment}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example/" + deployment + ":1"}}},
	}
	d, err := cs.AppsV1().Deployments(namespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: deployment},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("deployment %s: %v", deployment, err)
	}
	rsLabels := map[string]string{"app.kubernetes.io/name": deployment, "pod-template-hash": hash}
	tmpl.Labels = rsLabels
	rs, err := cs.AppsV1().ReplicaSets(namespace).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: deployment + "-" + hash, Labels: rsLabels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr(true)}}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: rsLabels}, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("replicaset of %s: %v", deployment, err)
	}
	return workload{namespace: namespace, deployment: deployment, hash: hash, rs: rs}
}

// podSpec is a pod of w's ReplicaSet bound to node, as the scheduler binds it.
func (w workload) pod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: w.namespace,
			Labels: map[string]string{"app.kubernetes.io/name": w.deployment, "pod-template-hash": w.hash},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: w.rs.Name,
				UID: w.rs.UID, Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "example/" + w.deployment + ":1"}}},
	}
}

// createPod creates p and, when containerID is given, reports its container running
// with that id, as the kubelet would.
func createPod(t *testing.T, cs *kubernetes.Clientset, p *corev1.Pod, containerID string) *corev1.Pod {
	t.Helper()
	got, err := tryCreatePod(cs, p, containerID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func tryCreatePod(cs *kubernetes.Clientset, p *corev1.Pod, containerID string) (*corev1.Pod, error) {
	ctx := context.Background()
	got, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if containerID == "" {
		return got, nil
	}
	got.Status.Phase = corev1.PodRunning
	got.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + containerID,
		Image: got.Spec.Containers[0].Image, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	got, err = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return got, nil
}

func deletePod(t *testing.T, cs *kubernetes.Clientset, namespace, name string) {
	t.Helper()
	// No kubelet confirms the end of the containers: delete at once, as a force delete.
	if err := cs.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatalf("delete pod %s/%s: %v", namespace, name, err)
	}
}

func labelPod(t *testing.T, cs *kubernetes.Clientset, namespace, name, key, value string) {
	t.Helper()
	if err := tryLabelPod(cs, namespace, name, key, value); err != nil {
		t.Fatal(err)
	}
}

func tryLabelPod(cs *kubernetes.Clientset, namespace, name, key, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := cs.CoreV1().Pods(namespace).Patch(context.Background(), name, k8stypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// checkAudit fails the test for every list or watch of pods by sonde's ServiceAccount,
// in any test so far, that did not select one node's pods across all namespaces, and for
// any other request of pods; it returns how many lists and watches selected node's, and
// how many of those were refused.
func checkAudit(t *testing.T, c *Cluster, node string) (lists, watches, refused int) {
	t.Helper()
	events, err := c.Audit(sondeUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.ObjectRef == nil || e.ObjectRef.Resource != "pods" {
			continue
		}
		if e.Verb != "list" && e.Verb != "watch" {
			t.Errorf("sonde asked for pods with verb %s: %s", e.Verb, e.RequestURI)
			continue
		}
		u, err := url.ParseRequestURI(e.RequestURI)
		if err != nil {
			t.Errorf("audit log: %v", err)
			continue
		}
		sel := u.Query().Get("fieldSelector")
		n, ok := strings.CutPrefix(sel, "spec.nodeName=")
		if !ok || strings.ContainsAny(n, ",=!") || u.Path != "/api/v1/pods" {
			t.Errorf("sonde's %s of pods without one node's field selector, or in one namespace: %s", e.Verb, e.RequestURI)
			continue
		}
		if n != node {
			continue
		}
		// 403s come while a restarted API server's RBAC caches fill, before /readyz.
		if e.ResponseStatus != nil && e.ResponseStatus.Code >= 400 {
			refused++
			continue
		}
		switch {
		case e.Verb == "list" && e.Stage == "ResponseComplete":
			lists++
		case e.Verb == "watch" && e.Stage == "ResponseStarted":
			watches++
		}
	}
	return lists, watches, refused
}
