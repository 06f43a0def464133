package testenv

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// StopThread stops one thread (PTRACE_SEIZE and PTRACE_INTERRUPT: no signal, no group
// stop), calls fn with its registers while it stands still, and lets it go.
func StopThread(tid int, fn func(regs *unix.PtraceRegs) error) error {
	// ptrace requests must come from the thread that seized.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		return fmt.Errorf("seize %d: %w", tid, err)
	}
	defer unix.PtraceDetach(tid)
	if err := unix.PtraceInterrupt(tid); err != nil {
		return fmt.Errorf("interrupt %d: %w", tid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		return fmt.Errorf("wait for %d: %w", tid, err)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		return fmt.Errorf("registers of %d: %w", tid, err)
	}
	return fn(&regs)
}
