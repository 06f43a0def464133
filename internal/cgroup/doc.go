// Package cgroup tells which container and pod a process belongs to from its
// /proc/PID/cgroup, and gives a cgroup v2 directory's id, the number BPF's
// bpf_get_current_cgroup_id returns for the processes in it.
package cgroup
