package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/kube"
	"github.com/sonde-profiler/sonde/trace"
)

// KubeConfig is the Kubernetes and cgroup settings.
type KubeConfig struct {
	NodeName    string   // --k8s-node-name: this node; empty outside Kubernetes
	Metadata    bool     // --k8s-metadata
	Kubeconfig  string   // --k8s-kubeconfig; the in-cluster service account when empty
	Namespaces  []string // --k8s-namespaces
	Selector    *kube.Selector
	Cgroups     []string // --cgroup
	CgroupRoot  string   // --cgroup-root; found in the mount table when empty
	FilterByPod bool     // the namespaces or the selector were given
}

// ParseKube checks the Kubernetes and cgroup flags.
func ParseKube(c *KubeConfig, namespaces, selector, cgroups string) error {
	c.Namespaces = splitList(namespaces)
	c.Cgroups = splitList(cgroups)
	if selector != "" {
		s, err := kube.ParseSelector(selector)
		if err != nil {
			return fmt.Errorf("--k8s-pod-selector %q: %w", selector, err)
		}
		c.Selector = s
	}
	c.FilterByPod = len(c.Namespaces) > 0 || c.Selector != nil
	if c.FilterByPod && (c.NodeName == "" || !c.Metadata) {
		return errors.New("--k8s-namespaces and --k8s-pod-selector need the pods of this node: set --k8s-node-name (NODE_NAME) and keep --k8s-metadata on")
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// cgroupIDs resolves --cgroup paths, relative to the cgroup v2 root, to the ids the
// kernel's filter holds.
func cgroupIDs(c *KubeConfig) ([]uint64, error) {
	if len(c.Cgroups) == 0 && !c.FilterByPod {
		return nil, nil
	}
	if c.CgroupRoot == "" {
		root, err := cgroup.Root("/proc/self/mountinfo")
		if err != nil {
			return nil, fmt.Errorf("--cgroup: %w; say where it is with --cgroup-root", err)
		}
		c.CgroupRoot = root
	}
	var ids []uint64
	for _, p := range c.Cgroups {
		if !filepath.IsAbs(p) || !strings.HasPrefix(filepath.Clean(p), filepath.Clean(c.CgroupRoot)) {
			p = filepath.Join(c.CgroupRoot, p)
		}
		id, err := cgroup.ID(p)
		if err != nil {
			return nil, fmt.Errorf("--cgroup %s: %w", p, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// kernelCgroups is the kernel's filter by cgroup id: bpf.Sampler, or a fake in tests.
type kernelCgroups interface {
	AddCgroup(id uint64) error
	RemoveCgroup(id uint64) error
}

// podFilter keeps the kernel's cgroup filter on the cgroups of the pods the namespaces
// and the selector choose, as the pods of this node come and go.
type podFilter struct {
	cfg     *KubeConfig
	kernel  kernelCgroups
	watcher *kube.Watcher
	log     *slog.Logger
	idOf    func(path string) (uint64, error) // cgroup.ID outside tests

	mu      sync.Mutex
	current map[string]uint64 // pod UID → the cgroup id in the filter
}

func (f *podFilter) chooses(p kube.Pod) bool {
	if len(f.cfg.Namespaces) > 0 && !slices.Contains(f.cfg.Namespaces, p.Namespace) {
		return false
	}
	return f.cfg.Selector == nil || f.cfg.Selector.Matches(p.Labels)
}

// update brings the filter in line with the pods known now.
func (f *podFilter) update() {
	f.mu.Lock()
	defer f.mu.Unlock()
	want := map[string]bool{}
	for _, p := range f.watcher.Pods() {
		if !f.chooses(p) {
			continue
		}
		want[p.UID] = true
		if _, ok := f.current[p.UID]; ok {
			continue
		}
		// The kubelet may make the pod's cgroup after the API server has the pod: a
		// later update (its status changes as its containers start) finds it.
		dir, err := cgroup.FindPod(f.cfg.CgroupRoot, p.UID)
		if err != nil {
			continue
		}
		id, err := f.idOf(dir)
		if err != nil {
			continue
		}
		if err := f.kernel.AddCgroup(id); err != nil {
			f.log.Warn("cannot profile pod", "pod", p.Namespace+"/"+p.Name, "err", err)
			continue
		}
		f.current[p.UID] = id
	}
	for uid, id := range f.current {
		if !want[uid] {
			f.kernel.RemoveCgroup(id)
			delete(f.current, uid)
		}
	}
}

// describer adds what Kubernetes and the environment say of a process to its resource,
// and names its service in the documented order: the service.name the process published
// in its OpenTelemetry process context (what its SDK uses), OTEL_SERVICE_NAME (or
// service.name in OTEL_RESOURCE_ATTRIBUTES) from the process's environment, the pod's
// app.kubernetes.io/name label, its app label, the container's name, the executable's.
type describer struct {
	watcher *kube.Watcher // nil without API access
	// runtimes are the language runtimes that tell something of their processes (a
	// php-fpm worker's pool).
	runtimes []trace.Describer
}

// Describe implements trace.Describer.
func (d describer) Describe(p *trace.Process) bool {
	if p.Attributes == nil {
		p.Attributes = map[string]string{}
	}
	var pod kube.Pod
	var ctr kube.Container
	found := false
	if d.watcher != nil && (p.PodUID != "" || p.ContainerID != "") {
		if pod, ctr, found = d.watcher.Lookup(p.PodUID, p.ContainerID); found {
			for _, a := range kube.Attributes(pod, ctr) {
				p.Attributes[a.Key] = a.Value
			}
		}
	}
	exe := p.Name
	if p.ExePath != "" {
		exe = filepath.Base(p.ExePath)
	}
	for _, name := range []string{p.Published["service.name"], p.EnvServiceName, pod.AppName, pod.App, ctr.Name, exe} {
		if name != "" {
			p.Attributes["service.name"] = name
			break
		}
	}
	// A container's pod the watch has not delivered yet, or whose container it has not
	// named yet, is asked about again.
	complete := true
	for _, r := range d.runtimes {
		complete = r.Describe(p) && complete
	}
	inPod := p.PodUID != "" || (p.ContainerID != "" && d.watcher != nil)
	return complete && (d.watcher == nil || !inPod || (found && ctr.Name != ""))
}

// maxFilteredPods sizes the kernel's cgroup filter for pods chosen as they come: a node
// runs at most a few hundred.
const maxFilteredPods = 4096

// watcherSyncTimeout bounds how long start-up waits for this node's pods to be listed.
const watcherSyncTimeout = 10 * time.Second

// newWatcher makes the Kubernetes pod watcher when sonde runs on a node and may ask the
// API server; without access it says once that resources carry ids only.
func newWatcher(cfg *Config, log *slog.Logger) (*kube.Watcher, error) {
	if cfg.Kube.NodeName == "" || !cfg.Kube.Metadata {
		return nil, nil
	}
	// The watcher retries what fails; each failure is said, as the API server's own
	// clients say them, so that an outage or a lost permission shows in the log.
	kc := kube.Config{NodeName: cfg.Kube.NodeName, OnError: func(err error) {
		log.Warn("Kubernetes pod watch", "err", err)
	}}
	if cfg.Kube.Kubeconfig != "" {
		// A kubeconfig that cannot be read is a mistake to say, not a cluster to go without.
		rc, err := kube.LoadKubeconfig(cfg.Kube.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--k8s-kubeconfig: %w", err)
		}
		kc.API = rc
	}
	w, err := kube.New(kc)
	if errors.Is(err, kube.ErrNoAPIAccess) {
		if cfg.Kube.FilterByPod {
			return nil, fmt.Errorf("--k8s-namespaces and --k8s-pod-selector need the API server: %w", err)
		}
		log.Info("no Kubernetes API access: resources carry container and pod ids only", "err", err)
		return nil, nil
	}
	return w, err
}

// startWatcher runs the pod watcher as a stage and, with pod filters, keeps the kernel's
// filter in line with it; it waits a while for the first list so that the processes read
// first are described in full.
func (p *Pipeline) startWatcher(ctx context.Context, stages *sync.WaitGroup) {
	if p.watcher == nil {
		return
	}
	if p.cfg.Kube.FilterByPod {
		p.pods = &podFilter{cfg: &p.cfg.Kube, kernel: p.sampler, watcher: p.watcher, log: p.log, idOf: cgroup.ID, current: map[string]uint64{}}
		p.watcher.OnChange(p.pods.update)
	}
	stages.Go(func() {
		if err := p.watcher.Run(ctx); err != nil {
			p.log.Warn("Kubernetes pod watch stopped: resources carry container and pod ids only", "err", err)
		}
	})
	for deadline := time.Now().Add(watcherSyncTimeout); !p.watcher.Synced() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if p.pods != nil {
		p.pods.update()
	}
}
