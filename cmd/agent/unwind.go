package main

import (
	"errors"
	"math"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/unwind"
)

// kernelTables lets the unwind package write to the sampler's maps without knowing BPF.
type kernelTables struct{ s *bpf.Sampler }

func (k kernelTables) AddTable(rows []unwind.Row) (uint32, error) {
	out := make([]bpf.UnwindRow, len(rows))
	for i, r := range rows {
		out[i] = bpf.UnwindRow{Pc: uint32(r.PC), CfaOffset: r.CFAOffset, FpOffset: int16(r.FPOffset), CfaRule: cfaRule(r.CFA), FpRule: fpRule(r.FP)}
		if r.FP == unwind.FPAtCFA && (r.FPOffset < math.MinInt16 || r.FPOffset > math.MaxInt16) {
			out[i].FpRule = bpf.FPInvalid
		}
	}
	first, err := k.s.AddRows(out)
	if errors.Is(err, bpf.ErrTableFull) {
		return 0, errors.Join(unwind.ErrTableFull, err)
	}
	return first, err
}

func (k kernelTables) SetProcess(pid uint32, mappings []unwind.ProcessMapping) error {
	out := make([]bpf.ExecMapping, len(mappings))
	for i, m := range mappings {
		out[i] = bpf.ExecMapping{Start: m.Start, End: m.End, Bias: m.Bias, RowsFirst: m.RowsFirst, RowsCount: m.RowsCount}
	}
	return k.s.SetProcess(pid, out)
}

func (k kernelTables) DeleteProcess(pid uint32) error { return k.s.DeleteProcess(pid) }

func cfaRule(r unwind.CFARule) uint8 {
	switch r {
	case unwind.CFASP:
		return bpf.CFASP
	case unwind.CFAFP:
		return bpf.CFAFP
	case unwind.CFAPLT:
		return bpf.CFAPLT
	case unwind.CFASignal:
		return bpf.CFASignal
	case unwind.CFAEndOfStack:
		return bpf.CFAEndOfStack
	default:
		return bpf.CFAInvalid
	}
}

func fpRule(r unwind.FPRule) uint8 {
	switch r {
	case unwind.FPUnchanged:
		return bpf.FPUnchanged
	case unwind.FPAtCFA:
		return bpf.FPAtCFA
	default:
		return bpf.FPInvalid
	}
}
