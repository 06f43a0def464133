package jvm

import "github.com/sonde-profiler/sonde/trace"

// Number is HotSpot's number among the runtimes, in the frames the kernel writes.
const Number uint8 = 4

// FrameType is OpenTelemetry's profile.frame.type value for JVM frames.
const FrameType = "jvm"

// How the kernel packs a JVM frame's 58 bits. Bit 57 tells the kind. A pc of the code
// cache keeps its 47 bits, whether it is a return address (bit 47) and the low byte of
// the compile id of the nmethod the walker found it in (bits 55–48), so that a later
// compilation at the same address is not taken for it. An interpreted frame keeps its
// Method* (8-aligned, below 2^47: 44 bits) and bci (13 bits, all ones when unknown).
const (
	kindShift     = 57
	kindCode      = 0
	kindInterp    = 1
	pcBits        = 47
	pcMask        = 1<<pcBits - 1
	returnBit     = 47
	tagShift      = 48
	methodShift   = 3
	methodBits    = 44
	bciBits       = 13
	bciMask       = 1<<bciBits - 1
	codePayload   = 1<<56 - 1 // pc, return bit and compile tag
	methodPayload = 1<<methodBits - 1
)

// BCIUnknown is an interpreted frame's bci when the walker could not tell it: the
// bytecode pointer was not within the method, the method is native, or the bci does not
// fit the frame.
const BCIUnknown = bciMask

// codeFlag marks a code identity (DecodeFrame) as a pc of the code cache rather than a
// Method*: no Method* has it, as every one is below 2^47.
const codeFlag = 1 << 62

// EncodeCodeFrame writes a frame of the code cache as the kernel does, for tests: its pc,
// whether the pc is a return address, and the low byte of the compile id read at the
// pc's code blob.
func EncodeCodeFrame(pc uint64, ret bool, compileTag uint8) uint64 {
	p := uint64(kindCode)<<kindShift | uint64(compileTag)<<tagShift | pc&pcMask
	if ret {
		p |= 1 << returnBit
	}
	return trace.EncodeInterpFrame(Number, p)
}

// EncodeInterpretedFrame writes an interpreted frame as the kernel does, for tests: its
// Method* and bci; a bci below 0 or past what the frame holds is written as BCIUnknown.
func EncodeInterpretedFrame(method uint64, bci int32) uint64 {
	b := uint64(BCIUnknown)
	if bci >= 0 && bci < BCIUnknown {
		b = uint64(bci)
	}
	return trace.EncodeInterpFrame(Number, uint64(kindInterp)<<kindShift|(method>>methodShift&methodPayload)<<bciBits|b)
}

// DecodeFrame splits a frame's payload into its code identity and offset. A pc of the
// code cache keeps its return bit and compile tag in the identity (so that each is a
// location of its own), marked by a flag no Method* has; its offset is 0. An
// interpreted frame's identity is its Method*, its offset the bci (BCIUnknown when not
// known).
func DecodeFrame(payload uint64) (code uint64, offset uint32) {
	if payload>>kindShift&1 == kindInterp {
		return (payload >> bciBits & methodPayload) << methodShift, uint32(payload & bciMask)
	}
	return codeFlag | payload&codePayload, 0
}

// codeFrame unpacks a code identity of a pc of the code cache; ok is false for a Method*.
func codeFrame(code uint64) (pc uint64, ret bool, tag uint8, ok bool) {
	if code&codeFlag == 0 {
		return 0, false, 0, false
	}
	return code & pcMask, code>>returnBit&1 != 0, uint8(code >> tagShift), true
}
