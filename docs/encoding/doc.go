// Package encoding is the stack-encoding study of docs/encoding.md: it loads profiles
// that sonde captured (testdata/*.otlp.pb.gz) into a neutral corpus and encodes the
// corpus five ways that differ only in how a sample names its stack:
//
//  1. pprof: each sample lists its location IDs (github.com/google/pprof/profile);
//  2. slices: OTEP 239's shared location_indices, one start/length per sample;
//  3. chunked: repeated start/length per sample over root-anchored chunks that a
//     hash-LRU deduplicates, as proposed in the "location references in sample"
//     discussion;
//  4. calltree: the parent-index tree of the same discussion, one node per distinct
//     (parent, location), a sample naming its leaf node;
//  5. stacktable: today's OTLP v1development stack_table, what sonde sends.
//
// Every encoding carries the same dictionary (mappings, locations, functions,
// strings), serialized the same way where the format allows, so size differences come
// from the stack representation. The experimental layouts (2-4) are written with
// protowire at field numbers that cost the same one-byte tags a real proposal would use.
//
// The package is a measurement, not a wire format sonde speaks: nothing outside its
// tests and benchmarks imports it. It also simulates a kernel-side variant, chunk
// hashes remembered in a BPF LRU map, to size the ring-buffer saving (see
// SimulateKernel).
package encoding
