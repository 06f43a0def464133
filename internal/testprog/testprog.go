// Package testprog holds programs that tests across packages compile and compare
// sonde's readers against, so each lives in one place.
package testprog

import (
	"os"
	"os/exec"
	"path/filepath"
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
