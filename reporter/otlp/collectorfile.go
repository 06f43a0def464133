package otlp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// What the OpenTelemetry Collector's file exporter writes (collector-contrib
// exporter/fileexporter: file_writer.go frames, marshaller.go and codec.go compress per
// message, compression_writer.go compresses the stream), for each export request:
//
//   - format json: the request as one line of OTLP/JSON;
//   - format proto: a record, the request's length as 4 bytes big-endian, then that
//     many bytes of protobuf, which is a ProfilesData (the request has the same fields);
//   - compression zstd: the request's bytes, protobuf or OTLP/JSON alike, compressed
//     alone into one zstd frame that is written as a record as above;
//   - compression zstd with the exporter.file.nativeCompression feature gate: no
//     per-request compression; the file as a whole is a zstd stream of records, or of
//     JSON lines with format json, cut into frames at each flush, or at each record
//     with rotation, a record over the rotation size into several.
//
// group_by and rotation only choose the file a request goes to: a record is written by a
// single Write, which rotation never splits.

// zstdMagic starts every zstd frame. No ProfilesData does: 0x28 is field 5, which
// the message does not have.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// Bounds on what decompression may produce, so that a small hostile file cannot take
// all memory or much time: any one record or line decompressed, the whole file
// decompressed, and the memory a zstd frame's header may make the decoder allocate (its
// window, or for a frame of one segment its content size). The exporter's encoder uses
// 8 MiB windows and one segment only up to that size; the zstd tool stays within 8 MiB
// below --ultra and --long. Variables only for the tests.
var (
	maxRecordBytes  int64  = 1 << 30
	maxInflateBytes int64  = 8 << 30
	maxZstdWindow   uint64 = 32 << 20
)

// IsExporterStream reports whether a file's first bytes begin as only the Collector's
// file exporter's binary output does: a zstd frame, or a record whose length is under
// 16 MiB, so that its first byte is zero. No protobuf message, pprof or OTLP, begins
// with a zero byte, which would be a tag of field 0.
func IsExporterStream(head []byte) bool {
	return bytes.HasPrefix(head, zstdMagic) || len(head) > 0 && head[0] == 0
}

// DecodeFile decodes OTLP profiles in any form a file holds them, told by content:
// what WriteFile writes (one binary ProfilesData, or OTLP/JSON lines) and every form
// the Collector's file exporter writes (JSON lines; records, each a 4-byte big-endian
// length and a ProfilesData; either compressed with zstd per request or as a whole).
// The profiles of all records merge as Decode merges those of JSON lines. A file cut
// short, a record whose length overruns the file, or data that decompresses beyond
// sane bounds is an error.
func DecodeFile(data []byte) ([]*trace.Profile, error) {
	switch {
	case bytes.HasPrefix(data, zstdMagic):
		d := newDecoder()
		if err := d.zstdFile(data, &inflateBudget{maxInflateBytes}); err != nil {
			return nil, fmt.Errorf("decode OTLP profiles: %w", err)
		}
		return d.result(), nil
	case len(data) == 0:
		return nil, nil
	case data[0] == '{':
		return Decode(data, true)
	case startsJSON(data):
		// JSON after blank lines, or a binary ProfilesData: its first byte, 0x0a, is a
		// newline, and its lengths may be white space and '{' too.
		profiles, err := Decode(data, true)
		if err == nil {
			return profiles, nil
		}
		profiles, berr := decodeBinary(data)
		if berr == nil {
			return profiles, nil
		}
		return nil, fmt.Errorf("%w; nor as protobuf: %v", err, berr)
	}
	return decodeBinary(data)
}

// decodeBinary decodes records, or else one binary ProfilesData.
func decodeBinary(data []byte) ([]*trace.Profile, error) {
	if !plausibleRecord(data) {
		return Decode(data, false)
	}
	d := newDecoder()
	n, rerr := d.records(data, &inflateBudget{maxInflateBytes})
	if rerr == nil {
		return d.result(), nil
	}
	rerr = fmt.Errorf("decode OTLP profiles: %w", rerr)
	if data[0] == 0 {
		return nil, rerr
	}
	// A record of 16 MiB or more, or a single ProfilesData over 160 MiB whose first
	// bytes happen to read as a length that fits: whichever form decodes is the one.
	profiles, err := Decode(data, false)
	if err == nil {
		return profiles, nil
	}
	if n > 0 {
		return nil, rerr
	}
	return nil, err
}

// startsJSON reports whether data may be OTLP/JSON: its first character other than
// white space is '{', or it is all white space, an empty JSON lines file.
func startsJSON(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	return len(data) > 0 && (len(trimmed) == 0 || trimmed[0] == '{')
}

// plausibleRecord reports whether data may begin with a record: a length that fits in
// the file, or a zero first byte that no single message can begin with.
func plausibleRecord(data []byte) bool {
	if len(data) > 0 && data[0] == 0 {
		return true
	}
	return len(data) >= 4 && uint64(binary.BigEndian.Uint32(data)) <= uint64(len(data)-4)
}

// records adds the records that fill data and returns how many decoded. Lengths are
// checked against what is left of data, so a lying one allocates nothing.
func (d *decoder) records(data []byte, b *inflateBudget) (int, error) {
	z := newZstdState(b)
	defer z.close()
	done := 0
	for off := 0; off < len(data); done++ {
		rest := data[off:]
		if len(rest) < 4 {
			return done, fmt.Errorf("record %d at byte %d: only %d of the 4 bytes of its length: the file is cut short", done+1, off, len(rest))
		}
		n := uint64(binary.BigEndian.Uint32(rest))
		if n > uint64(len(rest)-4) {
			return done, fmt.Errorf("record %d at byte %d: its length says %d bytes but %d follow: the file is cut short, or is not a file exporter's", done+1, off, n, len(rest)-4)
		}
		if err := d.record(rest[4:4+n], z); err != nil {
			return done, fmt.Errorf("record %d at byte %d: %w", done+1, off, err)
		}
		off += 4 + int(n)
	}
	return done, nil
}

// record adds one record's request: protobuf or OTLP/JSON, compressed with zstd or not.
func (d *decoder) record(b []byte, z *zstdState) error {
	if bytes.HasPrefix(b, zstdMagic) {
		var err error
		if b, err = z.inflate(b); err != nil {
			return err
		}
	}
	// The exporter's OTLP/JSON starts with the brace, and no ProfilesData does: 0x7b
	// would be field 15 as a group.
	if len(b) > 0 && b[0] == '{' {
		return d.addJSON(b)
	}
	var pd profilespb.ProfilesData
	if err := proto.Unmarshal(b, &pd); err != nil {
		return err
	}
	return d.add(&pd)
}

// zstdFile adds what a file compressed as a whole holds: records, or JSON lines. It
// reads them as the stream decompresses, so memory holds one record at a time.
func (d *decoder) zstdFile(data []byte, b *inflateBudget) error {
	z := newZstdState(b)
	defer z.close()
	zr, err := z.reader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(zr, 64<<10)
	if first, err := br.Peek(1); err == nil && first[0] == '{' {
		return d.jsonStream(br)
	} else if err != nil && err != io.EOF {
		return err
	}
	inner := newZstdState(b) // for a record compressed again inside the stream
	defer inner.close()
	var buf bytes.Buffer
	var off int64
	for i := 1; ; i++ {
		var head [4]byte
		k, err := io.ReadFull(br, head[:])
		if k == 0 && errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("record %d at byte %d of the decompressed stream: %w", i, off, cutShort(err))
		}
		n := int64(binary.BigEndian.Uint32(head[:]))
		if n > maxRecordBytes {
			return fmt.Errorf("record %d at byte %d of the decompressed stream: its length says %d bytes, more than the %d sonde reads", i, off, n, maxRecordBytes)
		}
		// The buffer grows with the bytes that come, not with what the length claims.
		buf.Reset()
		got, err := buf.ReadFrom(io.LimitReader(br, n))
		if err != nil {
			return fmt.Errorf("record %d at byte %d of the decompressed stream: %w", i, off, err)
		}
		if got < n {
			return fmt.Errorf("record %d at byte %d of the decompressed stream: its length says %d bytes but %d follow: the file is cut short", i, off, n, got)
		}
		if err := d.record(buf.Bytes(), inner); err != nil {
			return fmt.Errorf("record %d at byte %d of the decompressed stream: %w", i, off, err)
		}
		off += 4 + n
	}
}

// jsonStream adds OTLP/JSON lines as they decompress, each at most maxRecordBytes.
func (d *decoder) jsonStream(br *bufio.Reader) error {
	var line []byte
	for i := 1; ; i++ {
		line = line[:0]
		var err error
		for {
			var part []byte
			part, err = br.ReadSlice('\n')
			if int64(len(line)+len(part)) > maxRecordBytes {
				return fmt.Errorf("OTLP/JSON line %d: longer than the %d bytes sonde reads", i, maxRecordBytes)
			}
			line = append(line, part...)
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("OTLP/JSON line %d: %w", i, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if jerr := d.addJSON(line); jerr != nil {
				return fmt.Errorf("OTLP/JSON line %d: %w", i, jerr)
			}
		}
		if err != nil {
			return nil
		}
	}
}

// cutShort names io.ReadFull's own error for a length the stream ends inside; the
// decoder's errors, wrapped, stay as they are.
func cutShort(err error) error {
	if err == io.ErrUnexpectedEOF {
		return errors.New("the stream ends inside its 4-byte length: the file is cut short")
	}
	return err
}

// inflateBudget is what is left of maxInflateBytes for one file.
type inflateBudget struct{ left int64 }

// zstdState is a zstd decoder, made on first use, and the file's budget it spends.
// Records decode as streams too, not with DecodeAll, which would allocate the content
// size a frame's header claims, up to the limit of a whole record.
type zstdState struct {
	dec    *zstd.Decoder
	budget *inflateBudget
}

func newZstdState(b *inflateBudget) *zstdState { return &zstdState{budget: b} }

// reader decompresses r, failing once the file's budget is spent.
func (z *zstdState) reader(r io.Reader) (io.Reader, error) {
	var err error
	if z.dec == nil {
		// As a stream, max memory bounds a one-segment frame's buffer, not the output.
		z.dec, err = zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(maxZstdWindow))
	} else {
		err = z.dec.Reset(r)
	}
	if err != nil {
		return nil, zstdError(err)
	}
	return &budgetReader{r: z.dec, b: z.budget}, nil
}

// inflate decompresses one record's frame.
func (z *zstdState) inflate(b []byte) ([]byte, error) {
	r, err := z.reader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	n, err := out.ReadFrom(io.LimitReader(r, maxRecordBytes+1))
	if err != nil {
		return nil, err
	}
	if n > maxRecordBytes {
		return nil, fmt.Errorf("zstd: the record decompresses to more than the %d bytes sonde reads", maxRecordBytes)
	}
	return out.Bytes(), nil
}

func (z *zstdState) close() {
	if z.dec != nil {
		z.dec.Close()
	}
}

// budgetReader reads decompressed bytes and spends them from the budget.
type budgetReader struct {
	r io.Reader
	b *inflateBudget
}

func (r *budgetReader) Read(p []byte) (int, error) {
	// One byte past the budget tells a stream that ends there from one that goes on.
	if int64(len(p)) > r.b.left+1 {
		p = p[:r.b.left+1]
	}
	n, err := r.r.Read(p)
	r.b.left -= int64(n)
	if r.b.left < 0 {
		return n, fmt.Errorf("zstd: the file decompresses to more than the %d bytes sonde reads", maxInflateBytes)
	}
	if err != nil && err != io.EOF {
		err = zstdError(err)
	}
	return n, err
}

func zstdError(err error) error {
	switch {
	case errors.Is(err, zstd.ErrWindowSizeExceeded), errors.Is(err, zstd.ErrDecoderSizeExceeded):
		return fmt.Errorf("zstd: a frame asks for a buffer over the %d bytes sonde allows: %w", maxZstdWindow, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("zstd: the compressed data is cut short: %w", err)
	}
	return fmt.Errorf("zstd: %w", err)
}
