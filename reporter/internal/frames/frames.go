package frames

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/trace"
)

// Kind tells a frame's origin, for colouring: trace.Location.KindName ("native", "kernel",
// "go", or a language runtime's own name for its frames), or "process"
// for the pseudo-frame at the root of each process's stacks; empty when unknown.
type Kind string

const (
	KindUnknown Kind = ""
	KindNative  Kind = "native"
	KindKernel  Kind = "kernel"
	KindGo      Kind = "go"
	KindProcess Kind = "process"
)

func (k Kind) String() string {
	if k == KindUnknown {
		return "unknown"
	}
	return string(k)
}

func kindOf(l *trace.Location) Kind {
	if l.Kind == 0 {
		return KindUnknown
	}
	return Kind(l.KindName())
}

// Frame is one function of a stack as people read it.
type Frame struct {
	Name string // printable: see Clean
	File string // printable; empty when unknown
	Line int64  // 0 when unknown
	Kind Kind
}

// Unnamed names code that symbolization did not name by its address and mapped file,
// as the top table does, so the two outputs agree.
func Unnamed(l *trace.Location) string {
	if l.Mapping != nil && l.Mapping.Path != "" {
		return fmt.Sprintf("%#x (%s)", l.Address, l.Mapping.Path)
	}
	return fmt.Sprintf("%#x", l.Address)
}

// ProcessName names a process's root frame "name-PID", as stackcollapse-perf.pl --pid
// does, so folded stacks from sonde and from perf compare and merge. A process without
// a name falls back on its executable's base name, then on "unknown".
func ProcessName(p *trace.Process) string {
	name := p.Name
	if name == "" && p.ExePath != "" {
		name = filepath.Base(p.ExePath)
	}
	if name == "" {
		name = "unknown"
	}
	return Clean(name) + "-" + strconv.FormatUint(uint64(p.PID), 10)
}

// ParseProcessName splits a root frame written by ProcessName; ok is false when the
// frame does not have that form.
func ParseProcessName(frame string) (name string, pid uint32, ok bool) {
	i := strings.LastIndexByte(frame, '-')
	if i <= 0 || i == len(frame)-1 {
		return "", 0, false
	}
	digits := frame[i+1:]
	if digits[0] == '0' && len(digits) > 1 || digits[0] == '+' {
		return "", 0, false // not what FormatUint writes, so not a PID we wrote
	}
	n, err := strconv.ParseUint(digits, 10, 32)
	if err != nil {
		return "", 0, false
	}
	return frame[:i], uint32(n), true
}

// Stack appends a sample's frames to dst root first: the process (when process is set
// and the sample has one), then each location outermost first, a location's inlined
// lines outermost first, so the innermost inlined function comes last.
func Stack(dst []Frame, s *trace.Sample, process bool) []Frame {
	if process && s.Process != nil {
		dst = append(dst, Frame{Name: ProcessName(s.Process), Kind: KindProcess})
	}
	for i := len(s.Locations) - 1; i >= 0; i-- {
		l := s.Locations[i]
		if l == nil {
			continue
		}
		k := kindOf(l)
		if len(l.Lines) == 0 {
			dst = append(dst, Frame{Name: Clean(Unnamed(l)), Kind: k})
			continue
		}
		for j := len(l.Lines) - 1; j >= 0; j-- {
			ln := &l.Lines[j]
			name := ln.Function
			if name == "" {
				name = Unnamed(l)
			}
			dst = append(dst, Frame{Name: Clean(name), File: Clean(ln.File), Line: ln.Line, Kind: k})
		}
	}
	return dst
}

// Clean makes a name safe to print anywhere: invalid UTF-8 becomes U+FFFD, and control
// characters (C0, DEL, C1, which carry newlines and terminal escapes), the Unicode line
// and paragraph separators and the bidirectional controls become visible \xNN or \uNNNN
// escapes. Names that need none of this, nearly all of them, are returned as they are,
// without allocating.
func Clean(s string) string {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, size) {
			return clean(s, i)
		}
		i += size
	}
	return s
}

func needsEscape(r rune, size int) bool {
	return r == utf8.RuneError && size <= 1 || unicode.IsControl(r) || isSeparatorOrBidi(r)
}

// isSeparatorOrBidi reports the line and paragraph separators, which some readers take
// for line ends, and the bidirectional formatting characters, which reorder how the
// text around them displays and so can make one name look like another.
func isSeparatorOrBidi(r rune) bool {
	switch {
	case r == '\u2028', r == '\u2029', r == '\u061c', r == '\u200e', r == '\u200f':
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}

func clean(s string, from int) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:from])
	for i := from; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			b.WriteRune(utf8.RuneError)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || isSeparatorOrBidi(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
