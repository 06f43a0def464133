// Package testprog holds programs that tests across packages compile and compare
// sonde's readers against, so each lives in one place.
package testprog

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// CXX inlines at several depths: small static helpers, member functions of a template,
// and the standard library's containers and algorithms, which inline many levels deep
// at -O2.
const CXX = `
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace geo {
template <typename T> struct Vec {
  T x, y;
  inline T dot(const Vec &o) const { return x * o.x + y * o.y; }
  inline T norm2() const { return dot(*this); }
};
class Shape {
 public:
  virtual ~Shape() {}
  virtual double area() const = 0;
};
class Circle : public Shape {
 public:
  explicit Circle(double r) : r_(r) {}
  double area() const override { return 3.14159 * r_ * r_; }
 private:
  double r_;
};
static inline int mix(int a, int b) { return (a * 31) ^ (b >> 3); }
static inline int mix3(int a, int b, int c) { return mix(mix(a, b), c); }
template <typename T> __attribute__((noinline)) T accumulate(const std::vector<T> &v) {
  T s{};
  for (const auto &e : v) s += e;
  return s;
}
}  // namespace geo

static int counter;

__attribute__((noinline)) int work(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; i++) v.push_back(geo::mix3(i, n, counter));
  std::sort(v.begin(), v.end(), [](int a, int b) { return (a & 0xff) < (b & 0xff); });
  return geo::accumulate(v);
}

__attribute__((noinline)) double shapes(int n) {
  std::vector<geo::Shape *> s;
  for (int i = 0; i < n; i++) s.push_back(new geo::Circle(i));
  double a = 0;
  for (auto *p : s) { a += p->area(); delete p; }
  geo::Vec<double> v{a, 2.0};
  return v.norm2();
}

__attribute__((noinline)) std::string names(int n) {
  std::map<std::string, int> m;
  for (int i = 0; i < n; i++) m[std::to_string(i)] += i;
  std::string out;
  for (auto &kv : m) out += kv.first;
  return out;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100;
  counter = n;
  std::printf("%d %f %zu\n", work(n), shapes(n), names(n).size());
  return 0;
}
`

// BuildCXX compiles CXX with g++ and the given flags into a temporary directory.
func BuildCXX(t testing.TB, flags ...string) string {
	t.Helper()
	gxx := testenv.RequireTool(t, "g++")
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.cc")
	if err := os.WriteFile(src, []byte(CXX), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	args := append([]string{"-o", bin, src}, flags...)
	if out, err := exec.Command(gxx, args...).CombinedOutput(); err != nil {
		t.Fatalf("g++ %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// BuildC compiles a C program from src with gcc and the given flags into a temporary
// directory and returns the binary's path.
func BuildC(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	srcPath := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(srcPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	args := append([]string{"-o", bin, srcPath}, flags...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// GoInlining inlines small functions and methods into a loop, as Go code does all over.
const GoInlining = `package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

type point struct{ x, y int }

func (p point) add(q point) point { return point{p.x + q.x, p.y + q.y} }
func sq(x int) int                 { return x * x }
func norm(p point) int             { return sq(p.x) + sq(p.y) }

//go:noinline
func work(n int) int {
	s := 0
	p := point{1, 2}
	for i := 0; i < n; i++ {
		p = p.add(point{i, -i})
		s += norm(p)
	}
	return s
}

func main() {
	words := strings.Fields(strings.Repeat("b a c ", len(os.Args)*10))
	sort.Strings(words)
	fmt.Println(work(len(words)), strings.Join(words[:3], ","))
}
`

// BuildGo builds a one-file Go main package from src with the given go build flags.
func BuildGo(t testing.TB, src string, flags ...string) string {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	dir := t.TempDir()
	for name, content := range map[string]string{"main.go": src, "go.mod": "module example.com/prog\n\ngo 1.22\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "prog")
	cmd := exec.Command(goTool, append(append([]string{"build", "-o", bin}, flags...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", flags, err, out)
	}
	return bin
}

// GoLine is what go tool addr2line prints for an address: the physical function and
// the innermost file and line. Func is "?" where it knows nothing.
type GoLine struct {
	Func, File string
	Line       int64
}

// GoAddr2line asks go tool addr2line about each of addrs.
func GoAddr2line(t testing.TB, bin string, addrs []uint64) map[uint64]GoLine {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "%#x\n", a)
	}
	cmd := exec.Command(goTool, "tool", "addr2line", bin)
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool addr2line: %v", err)
	}
	res := map[uint64]GoLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for _, a := range addrs {
		if !sc.Scan() {
			t.Fatal("go tool addr2line: output ends early")
		}
		fn := sc.Text()
		if !sc.Scan() {
			t.Fatal("go tool addr2line: output ends early")
		}
		loc := sc.Text()
		colon := strings.LastIndexByte(loc, ':')
		n, err := strconv.ParseInt(loc[colon+1:], 10, 64)
		if colon < 0 || err != nil {
			t.Fatalf("go tool addr2line location %q", loc)
		}
		// Padding inside a function's extent has no line: ":-1" or "?:-1".
		line := GoLine{Func: fn, File: loc[:colon], Line: n}
		if n < 0 {
			line.File, line.Line = "", 0
		}
		res[a] = line
	}
	return res
}
