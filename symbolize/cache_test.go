package symbolize

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The cache against a model: a slice ordered by use, trimmed from its old end to the
// bounds, the newest entry always kept.
func TestLRUMatchesModel(t *testing.T) {
	type entry struct {
		k    int
		size int64
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, bounds := range []struct {
		maxLen   int
		maxBytes int64
	}{{1, 0}, {4, 0}, {50, 0}, {1000, 100}, {8, 40}, {3, 1}} {
		var model []entry // most recent last
		var evicted []int
		c := newLRU(bounds.maxLen, bounds.maxBytes, func(k int, v int) {
			if v != k*10 {
				t.Fatalf("evicted %d with value %d", k, v)
			}
			evicted = append(evicted, k)
		})
		if cap(c.slots) != 0 {
			t.Fatalf("a new cache holds %d slots: it must grow with use", cap(c.slots))
		}
		bytes := func() (n int64) {
			for _, e := range model {
				n += e.size
			}
			return n
		}
		for step := range 5000 {
			k := r.IntN(60)
			i := slices.IndexFunc(model, func(e entry) bool { return e.k == k })
			switch op := r.IntN(10); {
			case op < 5:
				v, ok := c.Get(k)
				if ok != (i >= 0) || (ok && v != k*10) {
					t.Fatalf("step %d: Get(%d) = %d, %v; model has it: %v", step, k, v, ok, i >= 0)
				}
				if ok {
					e := model[i]
					model = append(slices.Delete(model, i, i+1), e)
				}
			case op < 9:
				size := int64(r.IntN(20))
				evicted = evicted[:0]
				c.Add(k, k*10, size)
				if i >= 0 {
					model = slices.Delete(model, i, i+1)
				}
				model = append(model, entry{k, size})
				var want []int
				for len(model) > 1 && (len(model) > bounds.maxLen || (bounds.maxBytes > 0 && bytes() > bounds.maxBytes)) {
					want = append(want, model[0].k)
					model = model[1:]
				}
				if !slices.Equal(evicted, want) {
					t.Fatalf("step %d: Add(%d) evicted %v, want %v", step, k, evicted, want)
				}
			default:
				_, ok := c.Remove(k)
				if ok != (i >= 0) {
					t.Fatalf("step %d: Remove(%d) = %v", step, k, ok)
				}
				if ok {
					model = slices.Delete(model, i, i+1)
				}
			}
			if c.Len() != len(model) || c.Bytes() != bytes() {
				t.Fatalf("step %d: %d entries of %d bytes, model %d of %d", step, c.Len(), c.Bytes(), len(model), bytes())
			}
		}
		evicted = evicted[:0]
		c.Clear()
		if c.Len() != 0 || c.Bytes() != 0 || len(evicted) != len(model) {
			t.Fatalf("Clear left %d entries, evicted %d of %d", c.Len(), len(evicted), len(model))
		}
	}
}
