package python

import (
	"encoding/binary"
	"errors"
	"testing"
)

// debugOffsetsOf314 is a _Py_DebugOffsets as a 3.14.10 release build publishes it, and
// as 3.14.4's free-threaded build does: the words parseDebugOffsets reads, at their places.
func debugOffsetsOf314(freeThreaded bool) []byte {
	b := make([]byte, debugOffsetsSize)
	copy(b, debugOffsetsCookie)
	put := func(word int, v uint64) { binary.LittleEndian.PutUint64(b[word*8:], v) }
	f := debugOffsetFields[14]
	words := map[int]uint64{
		1:                  0x030e0af0,
		f.interpretersHead: 808, f.threadsHead: 7344,
		f.threadSize: 832, f.threadNext: 8, f.threadFrame: 72, f.threadID: 152,
		f.frameSize: 88, f.framePrevious: 8, f.frameCode: 0, f.frameInstr: 56, f.frameOwner: 74,
		f.codeSize: 216, f.codeFilename: 112, f.codeName: 120, f.codeQualname: 128, f.codeLineTable: 136,
		f.codeFirstLine: 68, f.codeAdaptive: 208, f.asciiSize: 40,
		f.objectSize: 16, f.obType: 8, f.bytesGroup: 40, f.bytesSize: 16, f.bytesData: 32,
		f.unicodeGroup: 64, f.unicodeState: 32, f.unicodeLength: 16,
	}
	if freeThreaded {
		for word, v := range map[int]uint64{
			1: 0x030e04f0, 2: 1,
			f.frameOwner: 78, f.frameTLBC: 72,
			f.codeSize: 240, f.codeFilename: 128, f.codeName: 136, f.codeQualname: 144, f.codeLineTable: 152,
			f.codeFirstLine: 84, f.codeAdaptive: 232, f.codeTLBC: 224, f.asciiSize: 56,
			f.objectSize: 32, f.obType: 24, f.bytesGroup: 56, f.bytesSize: 32, f.bytesData: 48,
			f.unicodeGroup: 80, f.unicodeState: 48, f.unicodeLength: 32,
		} {
			words[word] = v
		}
	}
	for word, v := range words {
		put(word, v)
	}
	return b
}

func TestDebugOffsets(t *testing.T) {
	v, l, err := parseDebugOffsets(debugOffsetsOf314(false))
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{InterpretersHead: 808, ThreadsHead: 7344, ThreadNext: 8, ThreadID: 152, ThreadFrame: 72, CFrameFrame: noOffset,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 74, FrameIsEntry: noOffset,
		CodeFirstLine: 68, CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeLineTable: 136, CodeAdaptive: 208,
		ASCIISize: 40, CompactSize: 56, Source: "debug_offsets",
		ObType: 8, UnicodeLength: 16, UnicodeState: 32, BytesSize: 16, BytesData: 32,
		FrameTLBC: noOffset, CodeTLBC: noOffset}
	if v.String() != "3.14.10" || l != want {
		t.Errorf("python %s, layout\n %+v\nwant\n %+v", v, l, want)
	}
	// The free-threaded build: object headers of 32 bytes, a str's state of another shape,
	// the thread-local bytecode's fields.
	v, l, err = parseDebugOffsets(debugOffsetsOf314(true))
	if err != nil {
		t.Fatal(err)
	}
	want = Layout{InterpretersHead: 808, ThreadsHead: 7344, ThreadNext: 8, ThreadID: 152, ThreadFrame: 72, CFrameFrame: noOffset,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 78, FrameIsEntry: noOffset,
		CodeFirstLine: 84, CodeFilename: 128, CodeName: 136, CodeQualname: 144, CodeLineTable: 152, CodeAdaptive: 232,
		ASCIISize: 56, CompactSize: 72, Source: "debug_offsets",
		ObType: 24, UnicodeLength: 32, UnicodeState: 48, BytesSize: 32, BytesData: 48,
		FreeThreaded: true, FrameTLBC: 72, CodeTLBC: 224}
	if v.String() != "3.14.4" || l != want {
		t.Errorf("free-threaded python %s, layout\n %+v\nwant\n %+v", v, l, want)
	}
	// What sonde cannot read is refused, never read with another version's places.
	for name, edit := range map[string]func(b []byte){
		"3.16":               func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 0x031000f0) },
		"free-threaded 3.15": func(b []byte) { b[16] = 1; binary.LittleEndian.PutUint64(b[8:], 0x030f02f0) },
		"moved fields":       func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].threadID*8:], 4096) },
		"a short object":     func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].codeSize*8:], 100) },
		"a short str":        func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].unicodeGroup*8:], 20) },
		"moved ob_type":      func(b []byte) { binary.LittleEndian.PutUint64(b[debugOffsetFields[14].obType*8:], 24) },
		"free-threaded, no thread-local bytecode": func(b []byte) {
			b[16] = 1
			binary.LittleEndian.PutUint64(b[debugOffsetFields[14].frameTLBC*8:], 200)
		},
	} {
		b := debugOffsetsOf314(false)
		edit(b)
		if _, _, err := parseDebugOffsets(b); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", name, err)
		}
	}
	if _, _, err := parseDebugOffsets(debugOffsetsOf314(false)[:100]); err == nil {
		t.Error("a truncated structure read")
	}
}
