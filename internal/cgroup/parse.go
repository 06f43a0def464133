package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Runtimes that Parse can tell from a cgroup path. A bare container id under a pod's
// cgroup (the cgroupfs driver) does not say which runtime made it: Runtime is "" then.
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "cri-o"
	RuntimeDocker     = "docker"
	RuntimePodman     = "podman"
)

// Limits of Parse. The kernel prints one line per hierarchy (a dozen or so) and paths
// of at most PATH_MAX; anything beyond is not a /proc/PID/cgroup file.
const (
	MaxInput = 64 << 10
	maxLines = 64
	maxPath  = 4096
)

// Info is what a process's cgroup membership says about it.
type Info struct {
	// Path is the process's cgroup v2 (unified) path when it has one, else the v1 path
	// the ids came from (or the name=systemd one). It is relative to the cgroup
	// namespace of whoever read the file: from inside a container's namespace, others'
	// paths start with "/..".
	Path string
	// ContainerID is the runtime's 64-hex-digit container id, or "".
	ContainerID string
	// PodUID is the Kubernetes pod UID with dashes (as the API server writes it), the
	// 32-hex-digit config hash of a static pod, or "".
	PodUID string
	// Runtime is one of the Runtime constants, or "" when the path does not say.
	Runtime string
}

// Parse reads the content of /proc/PID/cgroup. Lines are "ID:CONTROLLERS:PATH"; "0::PATH"
// is cgroup v2. Paths come from whoever named the cgroups, so they may hold any bytes;
// Parse never trusts them to be well formed.
//
// Ids are taken from the outermost path segment that carries one: a container with a
// delegated cgroup subtree can name its own sub-cgroups after another container, but it
// cannot rename the cgroups its runtime made above it.
func Parse(b []byte) (Info, error) {
	if len(b) > MaxInput {
		return Info{}, fmt.Errorf("cgroup file of %d bytes: longer than %d", len(b), MaxInput)
	}
	var (
		info    Info
		v2      bool
		v1      []string // paths, in file order
		systemd = -1     // index in v1 of the name=systemd hierarchy
		seen    = map[string]bool{}
	)
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 {
		return Info{}, errors.New("empty cgroup file")
	}
	for n, line := range bytes.Split(b, []byte("\n")) {
		if n >= maxLines {
			return Info{}, fmt.Errorf("cgroup file has more than %d lines", maxLines)
		}
		id, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return Info{}, fmt.Errorf("parse cgroup line %d: no hierarchy id", n+1)
		}
		controllers, path, ok := bytes.Cut(rest, []byte(":"))
		if !ok {
			return Info{}, fmt.Errorf("parse cgroup line %d: no controller list", n+1)
		}
		if _, err := strconv.ParseUint(string(id), 10, 32); err != nil {
			return Info{}, fmt.Errorf("parse cgroup line %d: hierarchy id %q: %w", n+1, id, err)
		}
		if len(path) == 0 || path[0] != '/' {
			return Info{}, fmt.Errorf("parse cgroup line %d: path is not absolute", n+1)
		}
		if len(path) > maxPath {
			return Info{}, fmt.Errorf("parse cgroup line %d: path longer than %d bytes", n+1, maxPath)
		}
		// A cgroup named with a newline could print a second line of its choosing;
		// the kernel prints each hierarchy once, so a repeat means a forgery.
		if seen[string(id)] {
			return Info{}, fmt.Errorf("parse cgroup line %d: hierarchy %s listed twice", n+1, id)
		}
		seen[string(id)] = true
		if string(id) == "0" && len(controllers) == 0 {
			v2 = true
			info.Path = string(path)
			continue
		}
		if string(controllers) == "name=systemd" {
			systemd = len(v1)
		}
		v1 = append(v1, string(path))
	}

	// The unified path is the one that names the process's cgroup for BPF, but in
	// hybrid setups it is "/" while the v1 paths carry the ids.
	if v2 {
		info.ContainerID, info.PodUID, info.Runtime = ids(info.Path)
		if info.ContainerID != "" || info.PodUID != "" {
			return info, nil
		}
	}
	for _, p := range v1 {
		c, pod, rt := ids(p)
		if c != "" || pod != "" {
			info.ContainerID, info.PodUID, info.Runtime = c, pod, rt
			if !v2 {
				info.Path = p
			}
			return info, nil
		}
	}
	if !v2 {
		switch {
		case systemd >= 0:
			info.Path = v1[systemd]
		case len(v1) > 0:
			info.Path = v1[0]
		}
	}
	return info, nil
}

// ids finds the container id, pod UID and runtime in one cgroup path.
func ids(path string) (container, pod, runtime string) {
	parent := ""
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "" || seg == "." || seg == ".." {
			continue
		}
		if pod == "" {
			pod = podUID(seg)
		}
		if container == "" {
			container, runtime = containerID(seg, parent)
		}
		if container != "" {
			// A pod's cgroup encloses its containers', so no pod UID comes later.
			return container, pod, runtime
		}
		parent = seg
	}
	return container, pod, runtime
}

// podUID recognizes a pod's cgroup: "pod<uid>" (cgroupfs driver) or
// "kubepods[-<qos>]-pod<uid_with_underscores>.slice" (systemd driver), alone or as the
// first part of containerd's "slice:cri-containerd:<id>".
func podUID(seg string) string {
	// containerd's "slice:prefix:id" names the pod's slice first.
	seg, _, _ = strings.Cut(seg, ":")
	if s, ok := strings.CutSuffix(seg, ".slice"); ok {
		if !strings.HasPrefix(s, "kubepods-") {
			return ""
		}
		i := strings.LastIndex(s, "-pod")
		if i < 0 {
			return ""
		}
		return normalUID(s[i+len("-pod"):])
	}
	if s, ok := strings.CutPrefix(seg, "pod"); ok {
		return normalUID(s)
	}
	return ""
}

// normalUID returns a pod UID with dashes and in lower case, or "" if s is none. UIDs
// are 8-4-4-4-12 hex digits; systemd slice names carry them with underscores, and
// static pods' cgroups carry the kubelet's 32-hex-digit config hash instead.
func normalUID(s string) string {
	switch len(s) {
	case 32:
		if isHex(s) {
			return strings.ToLower(s)
		}
	case 36:
		b := []byte(strings.ToLower(s))
		for i, c := range b {
			switch i {
			case 8, 13, 18, 23:
				if c != '-' && c != '_' {
					return ""
				}
				b[i] = '-'
			default:
				if !isHexByte(c) {
					return ""
				}
			}
		}
		return string(b)
	}
	return ""
}

// containerID recognizes a container's cgroup by the names runtimes give them:
// systemd scopes "<prefix>-<id>.scope", containerd's "slice:cri-containerd:<id>" form for
// systemd-managed pods without systemd, and bare ids under docker or a pod (cgroupfs).
func containerID(seg, parent string) (id, runtime string) {
	if s, ok := strings.CutSuffix(seg, ".scope"); ok {
		i := strings.LastIndexByte(s, '-')
		if i < 0 || !isID(s[i+1:]) {
			return "", ""
		}
		switch s[:i] {
		case "cri-containerd":
			return s[i+1:], RuntimeContainerd
		case "crio":
			return s[i+1:], RuntimeCRIO
		case "docker":
			return s[i+1:], RuntimeDocker
		case "libpod":
			return s[i+1:], RuntimePodman
		}
		// crio-conmon-<id> and libpod-conmon-<id> hold the runtime's monitor, not the
		// container.
		return "", ""
	}
	if parts := strings.Split(seg, ":"); len(parts) == 3 && isID(parts[2]) {
		switch parts[1] {
		case "cri-containerd":
			return parts[2], RuntimeContainerd
		case "crio":
			return parts[2], RuntimeCRIO
		case "docker":
			return parts[2], RuntimeDocker
		}
		return "", ""
	}
	if s, ok := strings.CutPrefix(seg, "crio-"); ok && isID(s) {
		return s, RuntimeCRIO
	}
	if s, ok := strings.CutPrefix(seg, "libpod-"); ok && isID(s) {
		return s, RuntimePodman
	}
	if isID(seg) {
		switch {
		case parent == "docker":
			return seg, RuntimeDocker
		case parent == "libpod_parent":
			return seg, RuntimePodman
		case podUID(parent) != "":
			return seg, ""
		}
	}
	return "", ""
}

// isID reports whether s is a container id as docker, containerd, cri-o and podman
// make them: 64 lower-case hex digits.
func isID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHexByte(s[i]) {
			return false
		}
	}
	return true
}

func isHexByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
