package lru

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestOrderAndEviction(t *testing.T) {
	l := New[int, string](3)
	var gone []int
	l.SetOnEvict(func(k int, _ string) { gone = append(gone, k) })
	for i := 1; i <= 3; i++ {
		if l.Add(i, "v") {
			t.Fatalf("add %d evicted below capacity", i)
		}
	}
	l.Get(1) // 2 is now the oldest
	if !l.Add(4, "v") {
		t.Fatal("add past capacity evicted nothing")
	}
	if !slices.Equal(gone, []int{2}) {
		t.Fatalf("evicted %v, want [2]", gone)
	}
	if got := l.Keys(); !slices.Equal(got, []int{3, 1, 4}) {
		t.Fatalf("keys %v, want oldest first [3 1 4]", got)
	}
	l.Peek(3) // no reordering
	if k, _, ok := l.Oldest(); !ok || k != 3 || l.Len() != 3 {
		t.Fatalf("oldest %d %v (len %d), want 3 left in place", k, ok, l.Len())
	}
	if k, _, _ := l.RemoveOldest(); k != 3 {
		t.Fatalf("oldest %d, want 3", k)
	}
	if !l.Remove(1) || l.Remove(1) {
		t.Fatal("remove reports presence wrongly")
	}
	if l.Add(4, "w") {
		t.Fatal("replacing a value evicted")
	}
	if v, ok := l.Get(4); !ok || v != "w" {
		t.Fatalf("get 4 = %q %v", v, ok)
	}
	if !slices.Equal(gone, []int{2, 3, 1}) {
		t.Fatalf("evicted %v, want [2 3 1]", gone)
	}
	l.Purge()
	if l.Len() != 0 || len(l.Keys()) != 0 {
		t.Fatal("purge left entries")
	}
	if _, _, ok := l.Oldest(); ok {
		t.Fatal("an empty cache has an oldest entry")
	}
}

// The cache agrees with a plain model under a random mix of operations, and holds
// no more nodes than entries it ever held.
func TestAgainstModel(t *testing.T) {
	const capacity = 50
	l := New[int, int](capacity)
	var model []int // keys, oldest first
	vals := map[int]int{}
	touch := func(k int) {
		model = slices.DeleteFunc(model, func(x int) bool { return x == k })
		model = append(model, k)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for step := range 20000 {
		k := r.IntN(120)
		switch r.IntN(4) {
		case 0, 1:
			l.Add(k, step)
			vals[k] = step
			touch(k)
			if len(model) > capacity {
				delete(vals, model[0])
				model = model[1:]
			}
		case 2:
			v, ok := l.Get(k)
			want, in := vals[k]
			if ok != in || v != want {
				t.Fatalf("step %d: get %d = %d %v, want %d %v", step, k, v, ok, want, in)
			}
			if ok {
				touch(k)
			}
		case 3:
			_, in := vals[k]
			if l.Remove(k) != in {
				t.Fatalf("step %d: remove %d disagrees", step, k)
			}
			delete(vals, k)
			model = slices.DeleteFunc(model, func(x int) bool { return x == k })
		}
		if l.Len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, l.Len(), len(model))
		}
	}
	if !slices.Equal(l.Keys(), model) {
		t.Fatalf("order %v, want %v", l.Keys(), model)
	}
	if len(l.nodes) > capacity+1 {
		t.Fatalf("%d nodes for a capacity of %d", len(l.nodes)-1, capacity)
	}
}

// An empty cache of a large capacity holds almost nothing: the namers of runtimes
// a host does not run keep theirs empty.
func TestGrowsWithUse(t *testing.T) {
	l := New[[2]uint64, *int](1 << 20)
	if cap(l.nodes) > 16 {
		t.Fatalf("%d nodes allocated before any entry", cap(l.nodes))
	}
}
