package testprog

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// Stacks runs, for as many seconds as its first argument says, one of the call chains
// that defeat a frame-pointer walk or a simple table walker, as its second argument
// names it: "sort" (a callback from libc's qsort), "deep" (recursion without frame
// pointers), "signal" (a handler's work, through libc's signal trampoline), "drap"
// (gcc's stack realignment, with its CFA in r10 and then an expression), "deref" and
// "index" (assembly whose CFA is a DW_CFA_def_cfa_expression, see ExprAsm). The work is
// in functions named *_hot; every one of them is called, at some depth, from main.
const Stacks = `#include <alloca.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void spin_hot(int n){for(int i=0;i<n;i++) acc=acc*31+i;}
KEEP int cmp_hot(const void*a,const void*b){long x=*(const long*)a,y=*(const long*)b;for(int i=0;i<200;i++) acc+=i^x;return (x>y)-(x<y);}
KEEP void sorter(void){static long v[4096];for(int i=0;i<4096;i++) v[i]=rand();qsort(v,4096,sizeof v[0],cmp_hot);}
KEEP int level(int d){char pad[32]; memset(pad,d,sizeof pad); if(d==0){spin_hot(20000);return pad[3];} return level(d-1)+pad[d%32];}
KEEP void on_alarm(int sig){spin_hot(3000000);}
KEEP void interrupted(void){for(int i=0;i<1000;i++) acc+=i;}
KEEP long drap_leaf_hot(long x, char *p){for(long i=0;i<20000;i++) acc=acc*31+i+x+p[0];return acc;}
/* Over-aligned locals, alloca and arguments on the stack make gcc realign with a
 * dynamic realignment argument pointer: the CFA in r10, then *(rbp-N). */
KEEP long drap(long a, long b, long c, long d, long e, long f, long g, long h){
 _Alignas(64) volatile long buf[8]; char *p=alloca((a&63)+1); memset(p,1,(a&63)+1);
 for(int i=0;i<8;i++) buf[i]=a+i+g+h;
 return drap_leaf_hot(buf[3],p)+b+c+d+e+f;}
long expr_deref(long n, long (*f)(long));
long expr_index(long n);
KEEP long deref_callee_hot(long x){for(long i=0;i<2000;i++) acc=acc*31+i+x;return acc;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); const char*mode=argc>2?argv[2]:"sort";
 if(!strcmp(mode,"signal")){struct sigaction sa={0}; sa.sa_handler=on_alarm; sigaction(SIGALRM,&sa,0);
  struct itimerval it={{0,20000},{0,20000}}; setitimer(ITIMER_REAL,&it,0);}
 while(now()<end){
  if(!strcmp(mode,"sort")) sorter();
  else if(!strcmp(mode,"deep")) acc+=level(40);
  else if(!strcmp(mode,"signal")) interrupted();
  else if(!strcmp(mode,"drap")) acc+=drap(acc,1,2,3,4,5,6,7);
  else if(!strcmp(mode,"deref")) acc+=expr_deref(2000,deref_callee_hot);
  else if(!strcmp(mode,"index")) acc+=expr_index(200000);
 } return 0;}
`

// ExprAsm holds hand-written functions whose call frame information uses
// DW_CFA_def_cfa_expression, written with .cfi_escape as OpenSSL's perlasm writes it:
//
//   - expr_deref realigns its stack, saves its caller's rsp in its frame and describes
//     the CFA as *(rsp+8)+8 (DW_OP_breg7 8; DW_OP_deref; DW_OP_plus_uconst 8); it calls
//     back into C, so a walk passes it as a caller too.
//   - expr_index keeps the saved rsp at rsp+8+r9*8, as bn_mul_mont does (DW_OP_breg7 8;
//     DW_OP_breg9 0; DW_OP_lit8; DW_OP_mul; DW_OP_plus; DW_OP_deref; DW_OP_plus_uconst
//     8): a leaf, whose walk needs r9 from the interrupted registers.
const ExprAsm = `	.text
	.globl	expr_deref
	.type	expr_deref, @function
	.p2align 4
expr_deref:
	.cfi_startproc
	movq	%rsp, %rax
	.cfi_def_cfa_register %rax
	pushq	%rbx
	.cfi_offset %rbx, -16
	pushq	%r12
	.cfi_offset %r12, -24
	subq	$80, %rsp
	andq	$-64, %rsp
	movq	%rax, 8(%rsp)
	.cfi_escape 0x0f,0x05,0x77,0x08,0x06,0x23,0x08
	movq	%rdi, %rbx
	movq	%rsi, %r12
	xorl	%eax, %eax
1:	movq	%rbx, %rdi
	call	*%r12
	movq	%rbx, %rcx
2:	imulq	$31, %rax, %rax
	addq	%rcx, %rax
	decq	%rcx
	jnz	2b
	movq	8(%rsp), %rcx
	movq	-16(%rcx), %r12
	movq	-8(%rcx), %rbx
	movq	%rcx, %rsp
	.cfi_def_cfa %rsp, 8
	ret
	.cfi_endproc
	.size	expr_deref, .-expr_deref

	.globl	expr_index
	.type	expr_index, @function
	.p2align 4
expr_index:
	.cfi_startproc
	movq	%rsp, %rax
	.cfi_def_cfa_register %rax
	movl	$5, %r9d
	subq	$64, %rsp
	andq	$-16, %rsp
	movq	%rax, 48(%rsp)
	.cfi_escape 0x0f,0x0a,0x77,0x08,0x79,0x00,0x38,0x1e,0x22,0x06,0x23,0x08
	movq	%rdi, %rcx
	xorl	%eax, %eax
1:	imulq	$31, %rax, %rax
	addq	%rcx, %rax
	decq	%rcx
	jnz	1b
	movq	8(%rsp,%r9,8), %rsp
	.cfi_def_cfa %rsp, 8
	ret
	.cfi_endproc
	.size	expr_index, .-expr_index
	.section	.note.GNU-stack,"",@progbits
`

// BuildStacks compiles Stacks and ExprAsm with gcc and the given flags.
func BuildStacks(t testing.TB, flags ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	c, s := filepath.Join(dir, "stacks.c"), filepath.Join(dir, "expr.s")
	if err := os.WriteFile(c, []byte(Stacks), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s, []byte(ExprAsm), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "stacks")
	args := append([]string{"-o", bin, c, s}, flags...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// GoGC allocates hard enough that the garbage collector's work (marking on dedicated
// workers, assists, sweeping, stack growth) takes a third of its CPU or more: much of its
// time is on g0 stacks, through runtime.systemstack, morestack and mcall. It runs for as
// many seconds as its first argument says.
const GoGC = `package main

import (
	"os"
	"strconv"
	"time"
)

type node struct {
	next, left *node
	data       [4]uint64
}

var live []*node

//go:noinline
func churn(n int) *node {
	var head *node
	for i := 0; i < n; i++ {
		head = &node{next: head, left: head}
		head.data[0] = uint64(i)
	}
	return head
}

//go:noinline
func deep(d int) int {
	var pad [512]byte
	pad[d%512] = byte(d)
	if d == 0 {
		live[len(live)-1] = churn(2000)
		return int(pad[0])
	}
	return deep(d-1) + int(pad[d%512])
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	live = make([]*node, 64)
	for i := range live {
		live[i] = churn(20000)
	}
	done := make(chan bool)
	go func() {
		for time.Now().Before(end) {
			// A new goroutine's stack grows to hold 30 frames of half a kilobyte: morestack.
			r := make(chan int)
			go func() { r <- deep(30) }()
			<-r
		}
		done <- true
	}()
	for i := 0; time.Now().Before(end); i++ {
		live[i%(len(live)-1)] = churn(20000)
	}
	<-done
}
`

// GoCgo calls C, whose code calls back into Go, whose code spins and allocates: a sample
// in goSpinHot reads main.callC, C's cgo_outer and cgo_inner, and the callback, through
// both of cgo's transitions. The C code has thread-local storage, so that the Go
// runtime's g is not the only variable of the TLS block. Its first argument is how many
// seconds it runs.
const GoCgo = `package main

/*
#include <stdint.h>
extern void goSpinHot(int);
static __thread int calls;
static volatile uint64_t cacc;
__attribute__((noinline)) static void cgo_inner(int n) { for (int i = 0; i < 4; i++) goSpinHot(n + i + calls++); }
// Not a tail call: cgo_outer keeps a frame of its own.
__attribute__((noinline)) static void cgo_outer(int n) { cgo_inner(n); cacc++; }
__attribute__((noinline)) static void c_spin_hot(int n) { for (int i = 0; i < n; i++) cacc = cacc * 31 + i; }
*/
import "C"

import (
	"os"
	"strconv"
	"time"
)

var (
	acc  uint64
	keep [][]byte
)

//export goSpinHot
func goSpinHot(n C.int) {
	for i := 0; i < 200000; i++ {
		acc = acc*31 + uint64(i) + uint64(n)
	}
	keep = append(keep, make([]byte, 64<<10))
	if len(keep) > 64 {
		keep = keep[:0]
	}
}

//go:noinline
func callC(n int) {
	C.cgo_outer(C.int(n))
	C.c_spin_hot(C.int(200000))
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for i := 0; time.Now().Before(end); i++ {
		callC(i)
	}
}
`

// GoSignals spins while another goroutine sends it signals, as fast as it can: a share
// of its time is in the runtime's signal handler, on the thread's signal stack, and in the
// kernel delivering them. Its first argument is how many seconds it runs.
const GoSignals = `package main

import (
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

var acc uint64

//go:noinline
func spin() {
	for i := 0; i < 100000; i++ {
		acc = acc*31 + uint64(i)
	}
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	c := make(chan os.Signal, 1024)
	signal.Notify(c, syscall.SIGUSR1)
	go func() {
		for range c {
		}
	}()
	go func() {
		for time.Now().Before(end) {
			syscall.Kill(os.Getpid(), syscall.SIGUSR1)
		}
	}()
	for time.Now().Before(end) {
		spin()
	}
}
`

// BuildGoWith builds a one-file Go main package from src with the given toolchain
// ("" for the go on PATH, else a GOTOOLCHAIN value such as go1.23.4, which the go
// command downloads) and environment (CGO_ENABLED=1 for cgo).
func BuildGoWith(t testing.TB, src, toolchain string, env ...string) string {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	dir := t.TempDir()
	for name, content := range map[string]string{"main.go": src, "go.mod": "module example.com/prog\n\ngo 1.21\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "prog")
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if toolchain != "" {
		cmd.Env = append(cmd.Env, "GOTOOLCHAIN="+toolchain)
	}
	cmd.Env = append(cmd.Env, env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "go build with toolchain %q: %v\n%s", toolchain, err, out)
	}
	return bin
}
