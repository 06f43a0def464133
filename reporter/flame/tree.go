package flame

import (
	"cmp"
	"slices"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

// Node is one frame of the call tree: a function called through one path.
type Node struct {
	Name string // printable; a process's root frame is "name-PID"
	// File and Line locate the function when symbolization knew them. Samples of one
	// node may be at different lines of it: Line is the one with the most samples.
	File string
	Line int64
	// Kind is "native", "kernel", "go", a language runtime's frame type (its
	// OpenTelemetry profile.frame.type value), "process" (the root frame of a process's stacks), or "" when the frame's kind is
	// unknown.
	Kind string
	// Self counts the samples that stop at this frame; Total those that pass it.
	Self, Total int64
	// Children are sorted by name, then file, so that equal profiles lay out equally.
	Children []*Node
}

// Tree is a profile's call tree, roots first: under Root ("all") comes one node per
// process, then each process's outermost functions.
type Tree struct {
	Root *Node
}

type childKey struct {
	parent     *Node
	name, file string
}

type lineKey struct {
	node *Node
	line int64
}

// NewTree builds the call tree of p. Every sample adds its count to the total of
// each node on its path, and to the self count of its last; a sample without frames
// counts in the root's self.
func NewTree(p *trace.Profile) *Tree {
	root := &Node{Name: "all"}
	children := make(map[childKey]*Node)
	lines := make(map[lineKey]int64)
	var stack []frames.Frame
	for _, s := range p.Samples {
		if s.Count <= 0 {
			continue
		}
		stack = frames.Stack(stack[:0], s, true)
		cur := root
		cur.Total += s.Count
		for _, f := range stack {
			k := childKey{cur, f.Name, f.File}
			n := children[k]
			if n == nil {
				n = &Node{Name: f.Name, File: f.File}
				n.Kind = string(f.Kind)
				children[k] = n
				cur.Children = append(cur.Children, n)
			}
			n.Total += s.Count
			if f.Line != 0 {
				lines[lineKey{n, f.Line}] += s.Count
			}
			cur = n
		}
		cur.Self += s.Count
	}
	best := make(map[*Node]int64, len(lines))
	for k, c := range lines {
		if b := best[k.node]; c > b || c == b && k.line < k.node.Line {
			best[k.node] = c
			k.node.Line = k.line
		}
	}
	walk(root, func(n *Node, _ int) {
		slices.SortFunc(n.Children, func(a, b *Node) int {
			return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.File, b.File))
		})
	})
	return &Tree{Root: root}
}

// walk calls fn on n and its descendants in preorder, with their depth below n.
func walk(n *Node, fn func(n *Node, depth int)) {
	type item struct {
		n     *Node
		depth int
	}
	todo := []item{{n, 0}}
	for len(todo) > 0 {
		it := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		fn(it.n, it.depth)
		for i := len(it.n.Children) - 1; i >= 0; i-- {
			todo = append(todo, item{it.n.Children[i], it.depth + 1})
		}
	}
}

// Row is one function's share of the samples in the top table.
type Row struct {
	Name string
	// Self counts the samples in the function itself; Cum those with the function
	// anywhere on the stack, once per sample however often it recurses.
	Self, Cum int64
}

// Top ranks the tree's functions (process frames aside) by self samples, then
// cumulative samples, then name, as the terminal's top table does.
func (t *Tree) Top() []Row {
	rows := make(map[string]*Row)
	row := func(name string) *Row {
		r := rows[name]
		if r == nil {
			r = &Row{Name: name}
			rows[name] = r
		}
		return r
	}
	// A node counts in its name's cumulative total unless an ancestor of the same name
	// already did: onPath counts the names on the path from the root. The walk keeps
	// its own stack, as a hostile file's stacks can be deeper than recursion should go.
	onPath := make(map[string]int)
	type visit struct {
		n     *Node
		leave bool
	}
	var todo []visit
	if t.Root != nil {
		todo = append(todo, visit{n: t.Root})
	}
	for len(todo) > 0 {
		v := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		counted := v.n.Kind != "process" && v.n != t.Root
		if v.leave {
			onPath[v.n.Name]--
			continue
		}
		if counted {
			r := row(v.n.Name)
			r.Self += v.n.Self
			if onPath[v.n.Name] == 0 {
				r.Cum += v.n.Total
			}
			onPath[v.n.Name]++
			todo = append(todo, visit{n: v.n, leave: true})
		}
		for _, c := range v.n.Children {
			todo = append(todo, visit{n: c})
		}
	}
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Self, a.Self), cmp.Compare(b.Cum, a.Cum), cmp.Compare(a.Name, b.Name))
	})
	return out
}
