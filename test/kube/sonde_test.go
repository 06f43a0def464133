package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestSondeNamesPodProcess ties a pod the API server knows to a real process: the
// process runs in a cgroup named as the kubelet's systemd driver names a pod's
// container's, with the pod's UID and the container's id. bin/sonde, running with the
// ServiceAccount's token in a kubeconfig and --k8s-namespaces, must profile it and only
// it, and put the pod, namespace, container, Deployment and the service.name of the
// pod's label on its resource.
func TestSondeNamesPodProcess(t *testing.T) {
	testenv.RequireRoot(t)
	bin := filepath.Join(root, "bin/sonde")
	if _, err := os.Stat(bin); err != nil {
		testenv.Unavailable(t, "no %s: run make build", bin)
	}
	cgRoot, err := cgroup.Root("/proc/self/mountinfo")
	if err != nil {
		testenv.Unavailable(t, "no cgroup v2 here: %v", err)
	}
	c := cluster(t)
	cs := adminClient(t, c)
	token := sondeToken(t, c)
	ensureNodes(t, cs, e2eNode)
	ensureNamespace(t, cs, "pay")
	ensureNamespace(t, cs, "other")
	w := makeWorkload(t, cs, "pay", "ledger", "6f5e4d3c2")
	const cid = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
	pod := createPod(t, cs, w.pod("ledger-6f5e4d3c2-x7k2p", e2eNode), cid)

	// A second pod on this node, in a namespace sonde is not told to profile.
	ow := makeWorkload(t, cs, "other", "noise", "1a2b3c4d5")
	const otherCID = "f9e8d7c6b5a4f9e8d7c6b5a4f9e8d7c6b5a4f9e8d7c6b5a4f9e8d7c6b5a4f9e8"
	other := createPod(t, cs, ow.pod("noise-1a2b3c4d5-q9w8e", e2eNode), otherCID)

	burn := func(t *testing.T, uid, cid string) *exec.Cmd {
		podDir := filepath.Join(cgRoot, "kubepods.slice", "kubepods-burstable.slice",
			"kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")
		ctrDir := filepath.Join(podDir, "cri-containerd-"+cid+".scope")
		if err := os.MkdirAll(ctrDir, 0o755); err != nil {
			testenv.Unavailable(t, "cannot make cgroups under %s: %v", cgRoot, err)
		}
		// A shell loop: sonde names it after the pod's label, not the executable.
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			for _, d := range []string{ctrDir, podDir} {
				os.Remove(d)
			}
			os.Remove(filepath.Join(cgRoot, "kubepods.slice", "kubepods-burstable.slice"))
			os.Remove(filepath.Join(cgRoot, "kubepods.slice"))
		})
		if err := os.WriteFile(filepath.Join(ctrDir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	proc := burn(t, string(pod.UID), cid)
	noise := burn(t, string(other.UID), otherCID)

	kubeconfig, err := c.Kubeconfig("sonde", token, false)
	if err != nil {
		t.Fatal(err)
	}
	tokenFileConfig, err := c.Kubeconfig("sonde-token-file", token, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("namespaces", func(t *testing.T) {
		checkSondeRun(t, bin, kubeconfig, []string{"--k8s-namespaces", "pay"}, pod, proc.Process.Pid, noise.Process.Pid, cid)
	})
	t.Run("selector, token file", func(t *testing.T) {
		checkSondeRun(t, bin, tokenFileConfig, []string{"--k8s-pod-selector", "app.kubernetes.io/name in (ledger),pod-template-hash"},
			pod, proc.Process.Pid, noise.Process.Pid, cid)
	})
	// A pod that comes after sonde started, in a namespace that had none: the kubelet
	// makes the pod's cgroup once the API server has the pod, and reports the container
	// after it started; the filter must follow, from nothing profiled to the pod's process.
	t.Run("late pod", func(t *testing.T) {
		ensureNamespace(t, cs, "late")
		lw := makeWorkload(t, cs, "late", "batch", "9a8b7c6d5")
		out := filepath.Join(t.TempDir(), "p.otlp.json")
		s := testenv.StartSonde(t, bin, "--k8s-node-name", e2eNode, "--k8s-kubeconfig", kubeconfig,
			"--k8s-namespaces", "late", "--output", out, "--top", "0")
		s.WaitMetric("sonde_samples_total", 0) // serving: sampling has started
		const lateCID = "1234abcd1234abcd1234abcd1234abcd1234abcd1234abcd1234abcd1234abcd"
		late := createPod(t, cs, lw.pod("batch-9a8b7c6d5-l8t3r", e2eNode), "")
		proc := burn(t, string(late.UID), lateCID)
		late.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + lateCID, Image: "example/batch:1", Ready: true}}
		if _, err := cs.CoreV1().Pods("late").UpdateStatus(context.Background(), late, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.WaitSamples(30)
		run := s.Stop()
		if run.Err != nil {
			t.Fatalf("sonde: %v\n%s", run.Err, run.Stderr)
		}
		resources, err := readResources(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resources {
			if r["process.pid"] == strconv.Itoa(proc.Process.Pid) {
				if r["k8s.pod.name"] != late.Name || r["k8s.deployment.name"] != "batch" || r["service.name"] != "batch" {
					t.Errorf("resource of the late pod's process: %v", r)
				}
				return
			}
			t.Errorf("a process outside the late pod was profiled: %v", r)
		}
		t.Errorf("no profile of the late pod's process among %d resources\nstderr:\n%s", len(resources), run.Stderr)
	})

	lists, _, _ := checkAudit(t, c, e2eNode)
	if lists == 0 {
		t.Error("the audit log has no list of pods by sonde")
	}
}

// readResources returns the resource attributes of every resource in an OTLP/JSON
// file (one ProfilesData per line), string values as they are, integers in decimal.
func readResources(path string) ([]map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type value struct {
		StringValue *string `json:"stringValue"`
		IntValue    *string `json:"intValue"`
	}
	var line struct {
		ResourceProfiles []struct {
			Resource struct {
				Attributes []struct {
					Key   string `json:"key"`
					Value value  `json:"value"`
				} `json:"attributes"`
			} `json:"resource"`
		} `json:"resourceProfiles"`
	}
	var out []map[string]string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 256<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		line.ResourceProfiles = nil
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, rp := range line.ResourceProfiles {
			m := map[string]string{}
			for _, a := range rp.Resource.Attributes {
				switch {
				case a.Value.StringValue != nil:
					m[a.Key] = *a.Value.StringValue
				case a.Value.IntValue != nil:
					m[a.Key] = *a.Value.IntValue
				}
			}
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// checkSondeRun runs bin/sonde with filter until it has samples, and checks the
// resource of the pod's process and that the other pod's process was left out.
func checkSondeRun(t *testing.T, bin, kubeconfig string, filter []string, pod *corev1.Pod, pid, noisePID int, cid string) {
	out := filepath.Join(t.TempDir(), "p.otlp.json")
	args := append([]string{"--k8s-node-name", e2eNode, "--k8s-kubeconfig", kubeconfig, "--output", out, "--top", "0"}, filter...)
	s := testenv.StartSonde(t, bin, args...)
	s.WaitSamples(30)
	run := s.Stop()
	if run.Err != nil {
		t.Fatalf("sonde: %v\n%s", run.Err, run.Stderr)
	}
	resources, err := readResources(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"k8s.pod.name": pod.Name, "k8s.pod.uid": string(pod.UID), "k8s.namespace.name": "pay",
		"k8s.node.name": e2eNode, "k8s.container.name": "app", "container.id": cid,
		"k8s.deployment.name": "ledger", "k8s.replicaset.name": "ledger-6f5e4d3c2", "service.name": "ledger",
	}
	found := false
	for _, r := range resources {
		rpid := r["process.pid"]
		if rpid == strconv.Itoa(noisePID) || r["k8s.namespace.name"] == "other" {
			t.Errorf("a process of a pod %v leaves out was profiled: %v", filter, r)
		}
		if rpid != strconv.Itoa(pid) {
			continue
		}
		found = true
		t.Logf("the pod's process: %v", r)
		for k, v := range want {
			if r[k] != v {
				t.Errorf("resource of the pod's process: %s = %q, want %q (all: %v)", k, r[k], v, r)
			}
		}
	}
	if !found {
		t.Fatalf("no profile of the pod's process %d among %d resources\nstderr:\n%s", pid, len(resources), run.Stderr)
	}
}
