package python

// lineRange says bytecode in [start, end), in bytes, comes from line (-1: no line).
type lineRange struct {
	start, end int
	line       int
}

// maxLineRanges bounds what a hostile line table can make a decoder produce.
const maxLineRanges = 1 << 16

// decodeLines decodes a code object's line table in the format of minor: 3.9's co_lnotab,
// 3.10's co_linetable, and since 3.11 the location table (Objects/locations.md). The
// ranges come in bytecode order.
func decodeLines(minor int, table []byte, firstLine int) []lineRange {
	switch {
	case minor <= 9:
		return decodeLnotab(table, firstLine)
	case minor == 10:
		return decodeLinetable310(table, firstLine)
	default:
		return decodeLocations(table, firstLine)
	}
}

// decodeLnotab: pairs of (bytecode increment, signed line increment); a line starts at
// the offset its increments reach, as PyCode_Addr2Line reads them.
func decodeLnotab(t []byte, line int) []lineRange {
	var out []lineRange
	addr := 0
	for i := 0; i+1 < len(t) && len(out) < maxLineRanges; i += 2 {
		next := addr + int(t[i])
		if next != addr {
			out = append(out, lineRange{start: addr, end: next, line: line})
			addr = next
		}
		line += int(int8(t[i+1]))
	}
	return append(out, lineRange{start: addr, end: 1 << 30, line: line})
}

// decodeLinetable310: pairs of (bytecode delta, signed line delta), -128 meaning no line
// for that range.
func decodeLinetable310(t []byte, line int) []lineRange {
	var out []lineRange
	addr := 0
	for i := 0; i+1 < len(t) && len(out) < maxLineRanges; i += 2 {
		end := addr + int(t[i])
		l := int(int8(t[i+1]))
		r := lineRange{start: addr, end: end, line: -1}
		if l != -128 {
			line += l
			r.line = line
		}
		if end != addr {
			out = append(out, r)
		}
		addr = end
	}
	return out
}

// decodeLocations: entries of a first byte (1, a 4-bit code, length-1 in code units) and
// the code's data: code 15 no location, 14 long form (signed line delta, end line, two
// columns), 13 a line delta alone, 10-12 a line delta of code-10 and two column bytes,
// 0-9 the same line and a column byte.
func decodeLocations(t []byte, line int) []lineRange {
	var out []lineRange
	addr, i := 0, 0
	varint := func() int {
		v, shift := 0, 0
		for i < len(t) && shift < 32 {
			b := int(t[i])
			i++
			v |= (b & 63) << shift
			shift += 6
			if b&64 == 0 {
				break
			}
		}
		return v
	}
	svarint := func() int {
		v := varint()
		if v&1 != 0 {
			return -(v >> 1)
		}
		return v >> 1
	}
	for i < len(t) && len(out) < maxLineRanges {
		first := t[i]
		i++
		if first&0x80 == 0 {
			break // not the start of an entry: the table is corrupt
		}
		code := int(first>>3) & 15
		end := addr + (int(first&7)+1)*2
		r := lineRange{start: addr, end: end, line: -1}
		switch {
		case code == 15:
		case code == 14:
			line += svarint()
			r.line = line
			varint()
			varint()
			varint()
		case code == 13:
			line += svarint()
			r.line = line
		case code >= 10:
			line += code - 10
			r.line = line
			i += 2
		default:
			r.line = line
			i++
		}
		out = append(out, r)
		addr = end
	}
	return out
}

// lineAt returns the line of the instruction at offset bytes into the bytecode, or -1.
func lineAt(ranges []lineRange, offset int) int {
	lo, hi := 0, len(ranges)
	for lo < hi {
		mid := (lo + hi) / 2
		if ranges[mid].end <= offset {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(ranges) && ranges[lo].start <= offset {
		return ranges[lo].line
	}
	return -1
}
