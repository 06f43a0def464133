package pipeline

import (
	"fmt"
	"testing"
)

// closers undo in the reverse order of making, each once.
func TestClosersUndoLastFirst(t *testing.T) {
	var undo closers
	var order []int
	for i := range 3 {
		undo.push(func() { order = append(order, i) })
	}
	undo.close()
	if fmt.Sprint(order) != "[2 1 0]" {
		t.Errorf("undone in the order %v, want [2 1 0]", order)
	}
}
