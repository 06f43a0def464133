package kube

import (
	"strings"
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

// apiPod is a pod as the API server sends it, in JSON: only the fields sonde keeps are
// decoded, the rest of each object is skipped.
type apiPod struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		UID             string            `json:"uid"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
		Annotations     map[string]string `json:"annotations"`
		OwnerReferences []struct {
			Kind       string `json:"kind"`
			Name       string `json:"name"`
			Controller *bool  `json:"controller"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		InitContainerStatuses      []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses          []containerStatus `json:"containerStatuses"`
		EphemeralContainerStatuses []containerStatus `json:"ephemeralContainerStatuses"`
	} `json:"status"`
}

type containerStatus struct {
	Name        string `json:"name"`
	ContainerID string `json:"containerID"`
}

// key is how the API names a pod: its namespace and name. A pod made again under its
// name has a new UID.
func (p *apiPod) key() string { return p.Metadata.Namespace + "/" + p.Metadata.Name }

// compact keeps what Lookup answers with from a pod the API server sent.
func compact(p *apiPod) (Pod, []Container) {
	m := &p.Metadata
	out := Pod{
		UID:        m.UID,
		Name:       m.Name,
		Namespace:  m.Namespace,
		NodeName:   p.Spec.NodeName,
		AppName:    m.Labels[LabelAppName],
		App:        m.Labels[LabelApp],
		Labels:     boundedLabels(m.Labels),
		mirrorHash: m.Annotations[annotationMirror],
	}
	for _, ref := range m.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		switch ref.Kind {
		case "ReplicaSet":
			out.ReplicaSet = ref.Name
			if h := m.Labels[labelPodTemplateHash]; h != "" {
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
		break // an object has one controller at most
	}
	var cs []Container
	for _, list := range [][]containerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
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

// stored is what the watcher keeps of a pod: the Pod and containers Lookup answers
// with, made once when the pod arrives, and the pod's key and resource version.
type stored struct {
	key, resourceVersion string
	pod                  Pod
	containers           []Container
}

// trim turns a pod the API server sent into what the watcher stores.
func trim(p *apiPod) *stored {
	pod, cs := compact(p)
	return &stored{key: p.key(), resourceVersion: p.Metadata.ResourceVersion, pod: pod, containers: cs}
}
