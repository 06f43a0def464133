package kube

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Labels whose values the agent may use for service.name.
const (
	LabelAppName = "app.kubernetes.io/name"
	LabelApp     = "app"
)

// Resource attribute keys of the OpenTelemetry semantic conventions.
const (
	AttrPodName         = "k8s.pod.name"
	AttrPodUID          = "k8s.pod.uid"
	AttrNamespaceName   = "k8s.namespace.name"
	AttrNodeName        = "k8s.node.name"
	AttrContainerName   = "k8s.container.name"
	AttrContainerID     = "container.id"
	AttrDeploymentName  = "k8s.deployment.name"
	AttrReplicaSetName  = "k8s.replicaset.name"
	AttrStatefulSetName = "k8s.statefulset.name"
	AttrDaemonSetName   = "k8s.daemonset.name"
	AttrJobName         = "k8s.job.name"
)

const (
	// The kubelet names a static pod's cgroup after its config hash, which the mirror
	// pod it shows the API server carries in this annotation.
	annotationMirror = "kubernetes.io/config.mirror"
	// The Deployment controller names each ReplicaSet <deployment>-<hash> and labels
	// its pods with the hash.
	labelPodTemplateHash = "pod-template-hash"
)

// Pod is what is kept of one pod.
type Pod struct {
	UID, Name, Namespace, NodeName string
	// AppName and App are the values of the labels LabelAppName and LabelApp, or "".
	AppName, App string
	// Owning workloads, each "" when the pod has none of that kind. Deployment is
	// derived from the ReplicaSet's name, with no request for the ReplicaSet.
	Deployment, ReplicaSet, StatefulSet, DaemonSet, Job string
	// Labels are the pod's labels, for selecting pods to profile; at most MaxLabels, each
	// key and value at most MaxLabelLength bytes (Kubernetes allows 63 for names and
	// values, 253 for prefixes).
	Labels map[string]string
	// mirrorHash is a static pod's config hash, the pod UID its cgroup path carries.
	mirrorHash string
}

// Container is one container of a pod. Name is "" when the pod's status does not (yet)
// list the container id.
type Container struct {
	ID, Name string
}

// Attribute is a resource attribute.
type Attribute struct {
	Key, Value string
}

// Attributes returns the semantic-convention attributes of a container in a pod,
// leaving out empty values.
func Attributes(p Pod, c Container) []Attribute {
	var attrs []Attribute
	add := func(k, v string) {
		if v != "" {
			attrs = append(attrs, Attribute{k, v})
		}
	}
	add(AttrPodName, p.Name)
	add(AttrPodUID, p.UID)
	add(AttrNamespaceName, p.Namespace)
	add(AttrNodeName, p.NodeName)
	add(AttrContainerName, c.Name)
	add(AttrContainerID, c.ID)
	add(AttrDeploymentName, p.Deployment)
	add(AttrReplicaSetName, p.ReplicaSet)
	add(AttrStatefulSetName, p.StatefulSet)
	add(AttrDaemonSetName, p.DaemonSet)
	add(AttrJobName, p.Job)
	return attrs
}

// compact keeps what Lookup answers with from a pod the API server sent.
func compact(p *corev1.Pod) (Pod, []Container) {
	out := Pod{
		UID:        string(p.UID),
		Name:       p.Name,
		Namespace:  p.Namespace,
		NodeName:   p.Spec.NodeName,
		AppName:    p.Labels[LabelAppName],
		App:        p.Labels[LabelApp],
		Labels:     boundedLabels(p.Labels),
		mirrorHash: p.Annotations[annotationMirror],
	}
	if ref := metav1.GetControllerOfNoCopy(p); ref != nil {
		switch ref.Kind {
		case "ReplicaSet":
			out.ReplicaSet = ref.Name
			if h := p.Labels[labelPodTemplateHash]; h != "" {
				if d, ok := strings.CutSuffix(ref.Name, "-"+h); ok && d != "" {
					out.Deployment = d
				}
			}
		case "StatefulSet":
			out.StatefulSet = ref.Name
		case "DaemonSet":
			out.DaemonSet = ref.Name
		case "Job":
			out.Job = ref.Name
		}
	}
	var cs []Container
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, s := range list {
			if id := containerID(s.ContainerID); id != "" {
				cs = append(cs, Container{ID: id, Name: s.Name})
			}
		}
	}
	return out, cs
}

// containerID strips the runtime scheme from a status's "<runtime>://<id>", so the id
// matches the one in cgroup paths.
func containerID(s string) string {
	if _, id, ok := strings.Cut(s, "://"); ok {
		return id
	}
	return s
}

// Bounds of the labels kept per pod: a pod's labels come from whoever created it.
const (
	MaxLabels      = 64
	MaxLabelLength = 320
)

// boundedLabels copies at most MaxLabels labels that fit MaxLabelLength.
func boundedLabels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]string, min(len(in), MaxLabels))
	for k, v := range in {
		if len(out) == MaxLabels {
			break
		}
		if len(k) <= MaxLabelLength && len(v) <= MaxLabelLength {
			out[k] = v
		}
	}
	return out
}

// stored is what the informer keeps of a pod, and what its handlers get: the Pod and
// containers Lookup answers with, made once, and shared with the watcher's maps. A
// *corev1.Pod trimmed to the same fields still takes 1.2 KB of struct, before its labels,
// owner references and container statuses, and the watcher kept its own copies beside it.
type stored struct {
	// Name, Namespace, UID and ResourceVersion only: the informer's key and accessors.
	metav1.ObjectMeta
	pod        Pod
	containers []Container
}

// GetObjectKind implements runtime.Object; a stored pod is never encoded.
func (s *stored) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (s *stored) DeepCopyObject() runtime.Object {
	c := &stored{pod: s.pod, containers: slices.Clone(s.containers)}
	s.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.pod.Labels = maps.Clone(s.pod.Labels)
	return c
}

// trim turns a pod the API server sent into what the informer stores.
func trim(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone, kept as it is
	}
	pod, cs := compact(p)
	return &stored{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		pod:        pod,
		containers: cs,
	}, nil
}
