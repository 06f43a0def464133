package dwarf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/sonde-profiler/sonde/internal/leb128"
)

// Forms a DWARF 5 line header may use to describe its directory and file entries
// (DWARF 5 section 7.5.6).
const (
	formBlock    = 0x09
	formData1    = 0x0b
	formData2    = 0x05
	formData4    = 0x06
	formData8    = 0x07
	formData16   = 0x1e
	formString   = 0x08
	formStrp     = 0x0e
	formLineStrp = 0x1f
	formStrpSup  = 0x1d
	formUdata    = 0x0f
	formStrx     = 0x1a
	formStrx1    = 0x25
	formStrx2    = 0x26
	formStrx3    = 0x27
	formStrx4    = 0x28
)

var errShortLineHeader = errors.New("line header runs past its unit")

// checkLineHeader vets the DWARF 5 line header at off in a .debug_line section before
// debug/dwarf reads it. debug/dwarf allocates the directory and file tables from the
// counts the header states before it reads a single entry, so one corrupt count asks
// the runtime for terabytes and kills the process: no recover catches that. Each
// count must fit the bytes left in the unit, at one byte or more per entry. Headers of
// earlier versions list their entries until an empty one and need no check.
func checkLineHeader(line []byte, off int64) error {
	if off < 0 || off >= int64(len(line)) {
		return nil // debug/dwarf reports a bad offset itself
	}
	h := lineHeader{b: line[off:], order: lineByteOrder(line[off:])}
	length := uint64(h.u32())
	offsetSize := 4
	if length == 0xffffffff {
		length, offsetSize = h.u64(), 8
	}
	if h.err != nil || length > uint64(len(h.b)) {
		return nil // debug/dwarf rejects a unit longer than the section
	}
	h.b = h.b[:length]
	if version := h.u16(); version < 5 {
		return nil
	}
	h.skip(2) // address and segment selector sizes
	h.skip(offsetSize)
	h.skip(5) // minimum instruction length, maximum operations, default is_stmt, line base, line range
	opcodeBase := h.u8()
	if opcodeBase > 0 {
		h.skip(int(opcodeBase) - 1)
	}
	for _, table := range []string{"directory", "file"} {
		if err := h.entries(table, offsetSize); err != nil {
			return fmt.Errorf("line header at %#x: %w", off, err)
		}
	}
	if h.err != nil {
		return fmt.Errorf("line header at %#x: %w", off, h.err)
	}
	return nil
}

type lineHeader struct {
	b     []byte
	order binary.ByteOrder
	err   error
}

// lineByteOrder tells the byte order from the header's version, a small number that
// reads as one in only one order; the section itself does not say.
func lineByteOrder(b []byte) binary.ByteOrder {
	at := 4
	if len(b) >= 4 && binary.LittleEndian.Uint32(b) == 0xffffffff {
		at = 12
	}
	if len(b) >= at+2 && b[at] == 0 && b[at+1] != 0 {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

// entries checks and skips one entry table: its format, its count and its entries,
// consuming them the way debug/dwarf does.
func (h *lineHeader) entries(table string, offsetSize int) error {
	forms := make([]uint64, h.u8())
	for i := range forms {
		h.uleb() // content type
		forms[i] = h.uleb()
	}
	count := h.uleb()
	if h.err != nil || count == 0 {
		return nil
	}
	// debug/dwarf reads nothing for a form it does not know, so an entry made only of
	// those takes no bytes and the count alone would size the table.
	perEntry := 0
	for _, form := range forms {
		perEntry += minFormSize(form, offsetSize)
	}
	if perEntry == 0 || count > uint64(len(h.b))/uint64(perEntry) {
		return fmt.Errorf("%d %s entries do not fit in %d bytes", count, table, len(h.b))
	}
	for range count {
		for _, form := range forms {
			h.form(form, offsetSize)
		}
		if h.err != nil {
			return nil
		}
	}
	return nil
}

// minFormSize is the fewest bytes a value of form takes, 0 for forms debug/dwarf skips.
func minFormSize(form uint64, offsetSize int) int {
	switch form {
	case formString, formUdata, formStrx, formBlock, formData1, formStrx1:
		return 1
	case formData2, formStrx2:
		return 2
	case formStrx3:
		return 3
	case formData4, formStrx4:
		return 4
	case formData8:
		return 8
	case formData16:
		return 16
	case formStrp, formLineStrp, formStrpSup:
		return offsetSize
	}
	return 0
}

func (h *lineHeader) form(form uint64, offsetSize int) {
	switch form {
	case formString:
		for len(h.b) > 0 && h.err == nil {
			if h.u8() == 0 {
				return
			}
		}
		h.fail()
	case formUdata, formStrx:
		h.uleb()
	case formBlock:
		n := h.uleb()
		if n > uint64(len(h.b)) {
			h.fail()
			return
		}
		h.skip(int(n))
	default:
		h.skip(minFormSize(form, offsetSize))
	}
}

func (h *lineHeader) fail() {
	if h.err == nil {
		h.err = errShortLineHeader
	}
	h.b = nil
}

func (h *lineHeader) skip(n int) {
	if n > len(h.b) {
		h.fail()
		return
	}
	h.b = h.b[n:]
}

// take consumes n ≤ 8 bytes; past the end it fails and yields zeros.
func (h *lineHeader) take(n int) []byte {
	if n > len(h.b) {
		h.fail()
		return make([]byte, n)
	}
	v := h.b[:n]
	h.b = h.b[n:]
	return v
}

func (h *lineHeader) u8() uint8   { return h.take(1)[0] }
func (h *lineHeader) u16() uint16 { return h.order.Uint16(h.take(2)) }
func (h *lineHeader) u32() uint32 { return h.order.Uint32(h.take(4)) }
func (h *lineHeader) u64() uint64 { return h.order.Uint64(h.take(8)) }

func (h *lineHeader) uleb() uint64 {
	if h.err != nil {
		return 0
	}
	v, n := leb128.Uint(h.b)
	if n == 0 {
		h.fail()
		return 0
	}
	h.b = h.b[n:]
	return v
}
