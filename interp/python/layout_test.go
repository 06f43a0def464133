package python

import (
	"encoding/binary"
	"errors"
	"testing"
)

// debugOffsetsOf314 is a _Py_DebugOffsets as a 3.14.10 release build publishes it: the
// words parseDebugOffsets reads, at their places.
func debugOffsetsOf314() []byte {
	b := make([]byte, debugOffsetsSize)
	copy(b, debugOffsetsCookie)
	put := func(word int, v uint64) { binary.LittleEndian.PutUint64(b[word*8:], v) }
	put(1, 0x030e0af0)
	f := debugOffsetFields[14]
	for word, v := range map[int]uint64{
		f.interpretersHead: 808, f.threadsHead: 7344,
		f.threadSize: 832, f.threadNext: 8, f.threadFrame: 72, f.threadID: 152,
		f.frameSize: 88, f.framePrevious: 8, f.frameCode: 0, f.frameInstr: 56, f.frameOwner: 74,
		f.codeSize: 216, f.codeFilename: 112, f.codeName: 120, f.codeQualname: 128, f.codeLineTable: 136,
		f.codeFirstLine: 68, f.codeAdaptive: 208, f.asciiSize: 40,
	} {
		put(word, v)
	}
	return b
}

func TestDebugOffsets(t *testing.T) {
	v, l, err := parseDebugOffsets(debugOffsetsOf314())
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{InterpretersHead: 808, ThreadsHead: 7344, ThreadNext: 8, ThreadID: 152, ThreadFrame: 72, CFrameFrame: noOffset,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 74, FrameIsEntry: noOffset,
		CodeFirstLine: 68, CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeLineTable: 136, CodeAdaptive: 208,
		ASCIISize: 40, CompactSize: 56, Source: "debug_offsets"}
	if v.String() != "3.14.10" || l != want {
		t.Errorf("python %s, layout\n %+v\nwant\n %+v", v, l, want)
	}
	// What sonde cannot read is refused, never read with another version's places.
	for name, edit := range map[string]func(b []byte){
		"3.16":           func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 0x031000f0) },
		"free-threaded":  func(b []byte) { b[16] = 1 },
		"moved fields":   func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].threadID*8:], 4096) },
		"a short object": func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].codeSize*8:], 100) },
	} {
		b := debugOffsetsOf314()
		edit(b)
		if _, _, err := parseDebugOffsets(b); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", name, err)
		}
	}
	if _, _, err := parseDebugOffsets(debugOffsetsOf314()[:100]); err == nil {
		t.Error("a truncated structure read")
	}
}
