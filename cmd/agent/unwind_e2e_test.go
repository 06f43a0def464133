package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// noFPC reaches its hot code three ways that defeat a frame-pointer walk: through a callback
// from libc's qsort (libc has no frame pointers), through a deep chain of functions built
// without them, and in a routine of assembly without call frame information (as HotSpot's
// copy routines are), which .eh_frame leaves out.
const noFPC = `#include <stdlib.h>
#include <string.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP int cmp_slow(const void*a,const void*b){long x=*(const long*)a,y=*(const long*)b;for(int i=0;i<200;i++) acc+=i^x;return (x>y)-(x<y);}
KEEP void sorter(void){static long v[4096];for(int i=0;i<4096;i++) v[i]=rand();qsort(v,4096,sizeof v[0],cmp_slow);}
KEEP void deep_hot(int n){for(int i=0;i<n;i++) acc=acc*31+i;}
KEEP int level(int d,int n){char pad[32]; memset(pad,d,sizeof pad); if(d==0){deep_hot(n);return pad[3];} return level(d-1,n)+pad[d%32];}
void asm_copy_words(long*dst,const long*src,unsigned long n);
__asm__(".text\n.globl asm_copy_words\n.type asm_copy_words,@function\nasm_copy_words:\n"
 " test %rdx,%rdx\n jz 2f\n1: mov (%rsi),%rax\n mov %rax,(%rdi)\n add $8,%rsi\n add $8,%rdi\n dec %rdx\n jnz 1b\n2: ret\n"
 ".size asm_copy_words,.-asm_copy_words\n");
KEEP void copier(int d){static long a[4096],b[4096]; char pad[48]; memset(pad,d,sizeof pad); for(int i=0;i<64;i++) asm_copy_words(b,a+(pad[i%48]&1),4095); acc+=b[7];}
int main(int argc,char**argv){double end=now()+atof(argv[1]); const char*mode=argc>2?argv[2]:"sort";
 while(now()<end){ if(!strcmp(mode,"sort")) sorter(); else if(!strcmp(mode,"asm")) copier((int)acc); else acc+=level(40,200000); } return 0;}
`

// signalC spends most of its time in a signal handler, whose stack runs through libc's
// signal trampoline (__restore_rt) back into the interrupted code. The handler spins for
// 12 ms of each 20 ms by the clock, not for a number of iterations, so that its share of
// the process's time (about 60 %) is the same on a fast CPU as on a slow one.
const signalC = `#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void handler_spin(void){double end=now()+0.012; while(now()<end) for(int i=0;i<100000;i++) acc=acc*31+i;}
KEEP void on_alarm(int sig){handler_spin();}
KEEP void interrupted(void){for(int i=0;i<100000;i++) acc+=i;}
int main(int argc,char**argv){double end=now()+atof(argv[1]);
 struct sigaction sa={0}; sa.sa_handler=on_alarm; sigaction(SIGALRM,&sa,0);
 struct itimerval it={{0,20000},{0,20000}}; setitimer(ITIMER_REAL,&it,0);
 while(now()<end) interrupted(); return 0;}
`

// dlopenMain loads its hot code from a library when told to on its standard input, which
// the test does once sonde tracks the process. The library warms up in plugin_warm until
// told again, which the test does once sonde walks through it: from then on, plugin_hot's
// samples must all be complete, however long sonde took to learn.
const (
	dlopenMain = `#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) void run_plugin(void(*entry)(double)){entry(atof(getenv("PLUGIN_SECS")));}
int main(int argc,char**argv){char go; if(read(0,&go,1)!=1) return 1; void*h=dlopen(argv[1],RTLD_NOW); if(!h){fprintf(stderr,"%s\n",dlerror());return 1;}
 void(*entry)(double)=(void(*)(double))dlsym(h,"plugin_entry"); if(!entry) return 1; run_plugin(entry); return 0;}
`
	dlopenLib = `#include <poll.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static int told(void){struct pollfd p={0,POLLIN,0}; return poll(&p,1,0)==1;}
__attribute__((noinline)) void plugin_warm(void){for(int i=0;i<100000;i++) acc=acc*31+i;}
__attribute__((noinline)) void plugin_hot(void){for(int i=0;i<100000;i++) acc=acc*31+i;}
__attribute__((noinline)) static void plugin_loop(double secs){double end=now()+secs; while(now()<end) plugin_hot();}
void plugin_entry(double secs){char c; while(!told()) plugin_warm(); if(read(0,&c,1)!=1) return; plugin_loop(secs); acc++;}
`
)

// reachShare is the share of samples holding hot whose stack also reaches main.
func reachShare(p *profile.Profile, hot string) (share float64, n int64) {
	share, n, _ = reachShareMisses(p, hot)
	return share, n
}

// reachShareMisses is reachShare with the stacks that hold hot and do not reach main,
// for a failing test to show.
func reachShareMisses(p *profile.Profile, hot string) (share float64, n int64, misses []string) {
	var reach int64
	for _, s := range p.Sample {
		fs := names(s)
		if !containsInOrder(fs, []string{hot}) {
			continue
		}
		n += s.Value[0]
		if containsInOrder(fs, []string{hot, "main"}) {
			reach += s.Value[0]
			continue
		}
		var frames []string
		for _, l := range s.Location {
			name := fmt.Sprintf("%#x", l.Address)
			if len(l.Line) > 0 {
				name = l.Line[0].Function.Name
			} else if l.Mapping != nil {
				name += " in " + filepath.Base(l.Mapping.File)
			}
			frames = append(frames, name)
		}
		misses = append(misses, fmt.Sprintf("%d× %s", s.Value[0], strings.Join(frames, " <- ")))
	}
	if n == 0 {
		return 0, 0, nil
	}
	return float64(reach) / float64(n), n, misses
}

// perfRecord runs perf record --call-graph dwarf on pids until stop is called, which
// returns perf's samples as perf script prints them: the reference sonde is compared with,
// taken of the same processes at the same time.
func perfRecord(t *testing.T, pids ...int) (stop func() []string) {
	t.Helper()
	perf := testenv.RequireTool(t, "perf")
	data := filepath.Join(t.TempDir(), "perf.data")
	var list []string
	for _, pid := range pids {
		list = append(list, strconv.Itoa(pid))
	}
	cmd := exec.Command(perf, "record", "-q", "-e", "cpu-clock", "-F", "499", "--call-graph", "dwarf",
		"-p", strings.Join(list, ","), "-o", data)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("perf record: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return func() []string {
		t.Helper()
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil && !strings.Contains(err.Error(), "interrupt") {
			t.Fatalf("perf record: %v\n%s", err, out.String())
		}
		script, err := exec.Command(perf, "script", "-i", data, "-F", "pid,ip,sym").Output()
		if err != nil {
			t.Fatalf("perf script: %v", err)
		}
		return strings.Split(string(script), "\n\n")
	}
}

// perfReachShare is the share of perf's samples of process pid in hot that reach main.
func perfReachShare(t *testing.T, samples []string, pid int, hot string) float64 {
	t.Helper()
	isHot, isMain := regexp.MustCompile(`\s`+hot+`\b`), regexp.MustCompile(`\smain\b`)
	var n, reach int
	for _, block := range samples {
		f := strings.Fields(block)
		if len(f) == 0 || f[0] != strconv.Itoa(pid) || !isHot.MatchString(block) {
			continue
		}
		n++
		if isMain.MatchString(block) {
			reach++
		}
	}
	if n == 0 {
		t.Fatalf("perf recorded no sample of process %d in %s", pid, hot)
	}
	return float64(reach) / float64(n)
}

func TestUnwindWithoutFramePointers(t *testing.T) {
	testenv.RequireRoot(t)
	strip := testenv.RequireTool(t, "strip")
	type unwindCase struct{ name, bin, mode, hot string }
	var cases []unwindCase
	for _, name := range []string{"nopie", "pie"} {
		flags := map[string][]string{
			"nopie": {"-O2", "-fomit-frame-pointer", "-no-pie"},
			"pie":   {"-O2", "-fomit-frame-pointer", "-fPIE", "-pie"},
		}[name]
		bin := buildWorkload(t, "nofp-"+name, noFPC, flags...)
		// strip -s leaves .eh_frame (the loader needs it) but drops .symtab; -rdynamic keeps
		// the names in .dynsym so the test can still find them.
		stripped := buildWorkload(t, "nofp-"+name+"-stripped", noFPC, append(flags, "-rdynamic")...)
		if out, err := exec.Command(strip, "-s", stripped).CombinedOutput(); err != nil {
			t.Fatalf("strip: %v\n%s", err, out)
		}
		signal := buildWorkload(t, "signal-"+name, signalC, flags...)
		for _, tc := range []unwindCase{
			{"", bin, "sort", "cmp_slow"},
			{"", bin, "deep", "deep_hot"},
			{"", stripped, "sort", "cmp_slow"},
			{"", bin, "asm", "asm_copy_words"},
			{"", signal, "signal", "handler_spin"},
		} {
			tc.name = fmt.Sprintf("%s/%s/%s", name, filepath.Base(tc.bin), tc.mode)
			cases = append(cases, tc)
		}
	}
	var cmds []*exec.Cmd
	for _, tc := range cases {
		cmds = append(cmds, exec.Command(tc.bin, "120", tc.mode))
	}
	g := startGroup(t, 50*time.Millisecond, "", cmds...) // past the loader, into its own code
	stopPerf := perfRecord(t, g.pids...)
	// 400 samples of the process hold about 240 in the hot function in the signal case
	// (60 % of the time), more in the others. A share of at least 0.99 means something
	// only from 100 samples on (one miss allowed), which 240 expected samples miss with
	// a probability below 1e-20.
	p := g.profile(400)
	perfSamples := stopPerf()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			share, n, misses := reachShareMisses(p.profileOf(i), tc.hot)
			if n < 100 {
				t.Fatalf("only %d samples in %s", n, tc.hot)
			}
			if share < 0.99 {
				t.Errorf("%.3f of %d samples in %s reach main, want at least 0.99; the others:\n%s",
					share, n, tc.hot, strings.Join(misses, "\n"))
			}
			ref := perfReachShare(t, perfSamples, g.pids[i], tc.hot)
			if share < ref-0.01 {
				t.Errorf("sonde: %.3f of samples in %s reach main; perf --call-graph dwarf: %.3f", share, tc.hot, ref)
			}
			t.Logf("%s: %.4f of %d samples reach main (perf --call-graph dwarf: %.4f)", tc.hot, share, n, ref)
		})
	}
}

// The unwinder must learn about code that appears after sonde started.
func TestUnwindThroughLateDlopen(t *testing.T) {
	testenv.RequireRoot(t)
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	lib := filepath.Join(dir, "libplugin.so")
	os.WriteFile(filepath.Join(dir, "plugin.c"), []byte(dlopenLib), 0o644)
	if out, err := exec.Command(gcc, "-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o", lib, filepath.Join(dir, "plugin.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	bin := buildWorkload(t, "host", dlopenMain, "-O2", "-fomit-frame-pointer", "-ldl")
	cmd := exec.Command(bin, lib)
	cmd.Env = append(os.Environ(), "PLUGIN_SECS=120")
	start, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	sonde(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := filepath.Join(t.TempDir(), "dl.pb.gz")
	s := testenv.StartSonde(t, sonde(t), "--pid", strconv.Itoa(cmd.Process.Pid), "--output", out, "--top", "0")
	// The library is loaded only once sonde has read the process's mappings without it.
	s.WaitMetric("sonde_processes", 1)
	// Every sample from the first word to the second is of plugin_warm, whose walks
	// complete once sonde has the library's table in the kernel and the process's
	// mappings as the loader left them.
	const complete = `sonde_unwind_walks_total{outcome="complete"}`
	walked := sondeMetric(t, s, complete)
	tell := func() {
		if _, err := start.Write([]byte{'\n'}); err != nil {
			t.Fatal(err)
		}
	}
	tell()
	s.WaitMetric(complete, walked+20)
	tell()
	// 300 samples from here hold about as many in plugin_hot, three times the 100 that a
	// share of 0.97 needs to mean something (three misses allowed).
	s.WaitSamples(uint64(sondeMetric(t, s, "sonde_samples_total")) + 300)
	if r := s.Stop(); r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	share, n, misses := reachShareMisses(readProfile(t, out), "plugin_hot")
	if n < 100 {
		t.Fatalf("only %d samples in plugin_hot", n)
	}
	if share < 0.97 {
		t.Errorf("%.3f of %d samples in the dlopened plugin_hot reach main, want at least 0.97; the others:\n%s",
			share, n, strings.Join(misses, "\n"))
	}
	t.Logf("plugin_hot: %.4f of %d samples reach main", share, n)
}

// sondeMetric reads one of a running agent's metrics.
func sondeMetric(t *testing.T, s *testenv.Sonde, name string) float64 {
	t.Helper()
	v, err := s.Metric(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// depthC spins at the bottom of a recursion of the depth given, without frame pointers.
const depthC = `#include <stdlib.h>
#include <string.h>
#include <time.h>
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
__attribute__((noinline)) void spin(void){for(int i=0;i<100000;i++) acc=acc*31+i;}
__attribute__((noinline)) int level(int d){char pad[24]; memset(pad,d,sizeof pad); if(d<=0){spin();return pad[1];} return level(d-1)+pad[d%24];}
int main(int argc,char**argv){double end=now()+atof(argv[1]); int depth=atoi(argv[2]); while(now()<end) acc+=level(depth); return 0;}
`

// BenchmarkUnwindDepth measures the kernel's cost per sample (bpf_stats) of table-driven
// unwinding at several stack depths, against the frame-pointer walk of bpf_get_stack.
func BenchmarkUnwindDepth(b *testing.B) {
	testenv.RequireRoot(b)
	bin := buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer")
	for _, depth := range []int{10, 50, 120} {
		for _, mode := range []string{"tables", "fp"} {
			b.Run(fmt.Sprintf("depth%d/%s", depth, mode), func(b *testing.B) {
				// main, level×(depth-3) and spin make about depth frames with libc's start-up.
				w := exec.Command(bin, "60", strconv.Itoa(depth-4))
				if err := w.Start(); err != nil {
					b.Fatal(err)
				}
				defer func() { w.Process.Kill(); w.Wait() }()
				for b.Loop() {
					ns, _ := bpfStats(b, w.Process.Pid, "--unwind", mode)
					b.ReportMetric(ns, "bpf-ns/sample")
				}
			})
		}
	}
}
