package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// workload is one program of the comparison: how to prepare its input and its command
// line. The command must run longer than the profiling window.
type workload struct {
	name    string
	about   string
	prepare func(dir string) ([]string, error) // returns the command line
}

// workloads are the six programs of the issue, on inputs made here so that runs repeat.
var workloads = []workload{
	{"xz", "xz -9 -T1 compressing 48 MB of generated text (liblzma, stripped)", prepareXZ},
	{"sqlite3", "sqlite3 building, indexing and grouping a 2-million-row table", prepareSQLite},
	{"openssl", "openssl speed rsa2048 (libcrypto's hand-written bn_*_mont assembly)", prepareOpenSSL},
	{"python3", "CPython 3.11: recursion, sorting, dicts, strings", preparePython},
	{"cc1plus", "cc1plus -O2 on a generated translation unit of C++ templates", prepareCC1Plus},
	{"go-compile", "the Go compiler (go tool compile) on a generated 40 000-line package", prepareGoCompile},
}

// words make text that compresses like text.
var words = strings.Fields(`the of and to in is was that for on with as by it at from his an were are which this
be or had not but have one all their they been has more when who would its other two first time can
into only new after some could these may over than such where most made between about through years`)

func prepareXZ(dir string) ([]string, error) {
	in := filepath.Join(dir, "input.txt")
	f, err := os.Create(in)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 48<<20; {
		word := words[r.IntN(len(words))]
		if r.IntN(50) == 0 {
			word = fmt.Sprintf("%d", r.IntN(100000))
		}
		k, _ := w.WriteString(word)
		w.WriteByte(" \n"[min(r.IntN(12), 1)])
		n += k + 1
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return []string{"sh", "-c", "exec xz -9 -T1 -c " + in + " > /dev/null"}, nil
}

func prepareSQLite(dir string) ([]string, error) {
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, `DROP TABLE IF EXISTS t%d;
CREATE TABLE t%d(a INTEGER, b TEXT, c REAL);
WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r LIMIT 2000000)
INSERT INTO t%d SELECT i, hex(randomblob(12)), abs(random() %% 1000) FROM r;
CREATE INDEX t%db ON t%d(b);
SELECT a %% 1000, count(*), sum(length(b)), avg(c) FROM t%d GROUP BY a %% 1000 ORDER BY 3 DESC LIMIT 1;
SELECT count(*) FROM t%d x JOIN t%d y ON x.a = y.a + 1 WHERE x.b < y.b;
`, i, i, i, i, i, i, i, i)
	}
	script := filepath.Join(dir, "work.sql")
	if err := os.WriteFile(script, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return []string{"sh", "-c", "exec sqlite3 :memory: < " + script + " > /dev/null"}, nil
}

func prepareOpenSSL(dir string) ([]string, error) {
	return []string{"openssl", "speed", "-seconds", "120", "rsa2048"}, nil
}

const pythonScript = `import sys, time
end = time.time() + float(sys.argv[1])
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
class Point:
    def __init__(self, x, y): self.x, self.y = x, y
    def norm(self): return self.x * self.x + self.y * self.y
acc = 0
while time.time() < end:
    acc += fib(20)
    words = sorted(str(i * 7919 % 10007) for i in range(20000))
    table = {w: len(w) for w in words}
    acc += sum(Point(i, len(w)).norm() for i, w in enumerate(words[:5000]))
    acc += len("-".join(reversed(words)))
print(acc)
`

func preparePython(dir string) ([]string, error) {
	script := filepath.Join(dir, "work.py")
	if err := os.WriteFile(script, []byte(pythonScript), 0o644); err != nil {
		return nil, err
	}
	// The interpreter itself, not a pyenv shim that execs it.
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return nil, fmt.Errorf("python3: %w", err)
	}
	return []string{strings.TrimSpace(string(out)), script, "120"}, nil
}

func prepareCC1Plus(dir string) ([]string, error) {
	var b strings.Builder
	b.WriteString("#include <algorithm>\n#include <map>\n#include <string>\n#include <vector>\n#include <functional>\n#include <memory>\n#include <sstream>\n")
	b.WriteString("template <int N> struct Rec { static int get(int x) { return Rec<N - 1>::get(x * 3 + N) ^ N; } };\n")
	b.WriteString("template <> struct Rec<0> { static int get(int x) { return x; } };\n")
	for i := range 400 {
		fmt.Fprintf(&b, `struct S%d { std::string name; std::vector<int> v; std::map<std::string, std::vector<S%d*>> kids; };
int f%d(int n) {
  std::vector<S%d> xs(n);
  std::map<std::string, std::function<int(int)>> m;
  for (int i = 0; i < n; i++) { std::ostringstream o; o << i; xs[i].name = o.str(); m[o.str()] = [i](int x) { return x + i; }; }
  std::sort(xs.begin(), xs.end(), [](const S%d &a, const S%d &b) { return a.name < b.name; });
  auto p = std::make_unique<S%d>();
  return Rec<%d>::get(n) + m.size() + p->v.size();
}
`, i, i, i, i, i, i, i, 20+i%40)
	}
	src := filepath.Join(dir, "big.cc")
	if err := os.WriteFile(src, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	ii := filepath.Join(dir, "big.ii")
	if out, err := exec.Command("g++", "-E", "-o", ii, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("g++ -E: %v\n%s", err, out)
	}
	out, err := exec.Command("g++", "-print-prog-name=cc1plus").Output()
	if err != nil {
		return nil, err
	}
	return []string{strings.TrimSpace(string(out)), "-quiet", "-O2", ii, "-o", "/dev/null"}, nil
}

func prepareGoCompile(dir string) ([]string, error) {
	var b strings.Builder
	b.WriteString("package main\n\n")
	for i := range 1500 {
		fmt.Fprintf(&b, `type T%d[K comparable, V any] struct { m map[K][]V; keys []K }

func (t *T%d[K, V]) Add(k K, v V) { if t.m == nil { t.m = map[K][]V{} }; if _, ok := t.m[k]; !ok { t.keys = append(t.keys, k) }; t.m[k] = append(t.m[k], v) }

func f%d(n int) int {
	var t T%d[string, int]
	s := 0
	for i := 0; i < n; i++ {
		k := string(rune('a' + i%%26))
		t.Add(k, i*%d)
		func() { defer func() { s += recover().(int) }(); panic(i) }()
	}
	for _, k := range t.keys { for _, v := range t.m[k] { s += v } }
	switch n %% 7 { case 0: s++; case 1: s += 2; case 2: s *= 3; default: s -= %d }
	return s
}

`, i, i, i, i, i, i)
	}
	b.WriteString("func main() { s := 0\n")
	for i := range 1500 {
		fmt.Fprintf(&b, "\ts += f%d(%d)\n", i, i%50)
	}
	b.WriteString("\tprintln(s) }\n")
	src := filepath.Join(dir, "big.go")
	if err := os.WriteFile(src, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	// The compiler reads the runtime's export data through an import config, as go
	// build gives it one.
	out, err := exec.Command("go", "list", "-export", "-f", "{{.ImportPath}}={{.Export}}", "runtime").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export runtime: %w", err)
	}
	cfg := filepath.Join(dir, "importcfg")
	if err := os.WriteFile(cfg, []byte("packagefile "+strings.TrimSpace(string(out))+"\n"), 0o644); err != nil {
		return nil, err
	}
	tooldir, err := exec.Command("go", "env", "GOTOOLDIR").Output()
	if err != nil {
		return nil, err
	}
	return []string{filepath.Join(strings.TrimSpace(string(tooldir)), "compile"), "-o", filepath.Join(dir, "big.o"), "-p", "main",
		"-importcfg", cfg, src}, nil
}
