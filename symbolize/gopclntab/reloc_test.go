package gopclntab

import (
	"encoding/binary"
	"testing"
)

// TestRelocatedAfterLoad: once Load has let go of the file, a word the file holds as zero
// reads as zero, as it did before the relocations were shared, rather than reading the
// relocations of a file that is gone.
func TestRelocatedAfterLoad(t *testing.T) {
	m := &image{order: binary.LittleEndian}
	if v := m.relocated(0x1000); v != 0 {
		t.Errorf("relocated word %#x, want 0", v)
	}
	if m.relative == nil || m.relative.Len() != 0 {
		t.Errorf("relocations %+v, want none, read once", m.relative)
	}
}
