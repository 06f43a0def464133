package jvm

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestInterpreterFrame names interpreted frames as a kernel walker would find them: a
// JVM that only interprets (-Xint) is stopped thread by thread until one's pc is in the
// template interpreter; its frame pointer then leads to the frame's Method* and bcp at
// the slots Layout.Frame gives, which must name one of SondeChain's methods at a line of
// its source.
func TestInterpreterFrame(t *testing.T) {
	for _, jdk := range testenv.JDKs {
		t.Run(fmt.Sprint(jdk.Major), func(t *testing.T) {
			j := startChain(t, jdk, "-Xint")
			start, end, err := j.p.Interpreter()
			if err != nil {
				t.Fatal(err)
			}
			if b, err := j.p.BlobAt(start + (end-start)/2); err != nil || b.Name != "Interpreter" {
				t.Errorf("blob in the interpreter's code: %+v, %v", b, err)
			}
			fr := j.p.Layout.Frame
			n := NewNamer(j.p, NamerConfig{})
			var got Frame
			stops := 0
			testenv.WaitFor(t, "a thread interpreting SondeChain", testenv.StartTimeout, func() (bool, string) {
				tasks, err := os.ReadDir("/proc/" + strconv.Itoa(j.pid) + "/task")
				if err != nil {
					return false, err.Error()
				}
				state := "no thread in the interpreter"
				for _, task := range tasks {
					tid, _ := strconv.Atoi(task.Name())
					err := testenv.StopThread(tid, func(regs *unix.PtraceRegs) error {
						stops++
						if regs.Rip < start || regs.Rip >= end {
							return nil
						}
						fp := regs.Rbp
						method, err1 := readU64(j.p.m, fp+uint64(int64(fr.Method)*8))
						bcp, err2 := readU64(j.p.m, fp+uint64(int64(fr.BCP)*8))
						if err1 != nil || err2 != nil {
							state = fmt.Sprintf("fp %#x unreadable", fp)
							return nil
						}
						f, err := n.Interpreted(method, bcp)
						state = fmt.Sprintf("pc %#x fp %#x: %+v, %v", regs.Rip, fp, f, err)
						if err == nil && f.Class == "SondeChain" && f.BCI >= 0 {
							got = f
						}
						return nil
					})
					if err != nil {
						state = err.Error()
					}
					if got.Method != 0 {
						return true, ""
					}
				}
				return false, state
			})
			t.Logf("JDK %s: interpreted frame %s%s line %d bci %d, after stopping threads %d times", jdk.Name, got.Function, got.Signature, got.Line, got.BCI, stops)
			if got.File != "SondeChain.java" || got.Line < 11 || got.Line > 35 {
				t.Errorf("interpreted frame %+v: not at a line of SondeChain.java", got)
			}
		})
	}
}
