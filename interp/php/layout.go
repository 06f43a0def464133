package php

import (
	"errors"
	"fmt"
)

// Version is a PHP release.
type Version struct{ Major, Minor, Micro int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// ErrUnsupported: an engine of a version or build sonde cannot walk.
var ErrUnsupported = errors.New("unsupported php engine")

// Layout is where the engine keeps what the walk and the names need, as byte offsets.
type Layout struct {
	// executor_globals: current_execute_data, the innermost frame.
	CurrentExecuteData int
	// zend_execute_data: opline, func, This.u1.type_info (the call info) and
	// prev_execute_data.
	ExOpline, ExFunc, ExCallInfo, ExPrev int
	// zend_function (its common head): type, fn_flags, function_name, scope.
	FuncType, FuncFlags, FuncName, FuncScope int
	// zend_op_array: filename, then line_start and line_end (uint32 each).
	OpArrayFilename, OpArrayLineStart int
	// zend_op: lineno.
	OpLineno int
	// zend_class_entry: name.
	ClassName int
	// zend_string: its flags word (zend_refcounted_h's type_info), len, val.
	StrTypeInfo, StrLen, StrVal int
}

// layouts are the engine's layouts per minor version of PHP 8 on 64-bit Linux: facts of
// each version's headers (Zend/zend_globals.h, zend_compile.h, zend_types.h), compiled
// against Debian's php8.2-dev and php8.4-dev headers with offsetof for 8.2 and 8.4, read
// from the headers for 8.1 and 8.3 (whose executor_globals sonde leaves to the code).
// The executor's frame, the function's common head, zend_op and zend_string are the same
// in every PHP 8; what moved is executor_globals (the JIT's and fibers' fields) and
// zend_op_array, whose common head grew in 8.2 (run_time_cache, T) and 8.4 (doc_comment,
// prop_info for property hooks). The two offsets that moved are checked against the
// file's own code at inspection (checkLayout), and a version this table lacks is refused.
var layouts = map[int]Layout{
	1: layout8(fromCode, 144),
	2: layout8(488, 152),
	3: layout8(fromCode, 152),
	4: layout8(488, 168),
}

// fromCode marks an offset the table does not hold: the file's code tells it, or the file
// is refused.
const fromCode = -1

// MinMinor and MaxMinor bound the PHP 8 releases the table holds.
const (
	MinMinor = 1
	MaxMinor = 4
)

func layout8(currentExecuteData, filename int) Layout {
	return Layout{
		CurrentExecuteData: currentExecuteData,
		ExOpline:           0, ExFunc: 24, ExCallInfo: 40, ExPrev: 48,
		FuncType: 0, FuncFlags: 4, FuncName: 8, FuncScope: 16,
		OpArrayFilename: filename, OpArrayLineStart: filename + 8,
		OpLineno:    24,
		ClassName:   8,
		StrTypeInfo: 4, StrLen: 16, StrVal: 24,
	}
}

// tableLayout returns a version's layout.
func tableLayout(v Version) (Layout, error) {
	l, ok := layouts[v.Minor]
	if v.Major != 8 || !ok {
		return Layout{}, fmt.Errorf("php %s: %w (sonde knows 8.%d to 8.%d)", v, ErrUnsupported, MinMinor, MaxMinor)
	}
	return l, nil
}
