/* SPDX-License-Identifier: GPL-2.0 */
/* The language runtimes the sampler walks: the one list of them in the kernel program.
 * A runtime is its header (its maps, its walker, its <name>_forget) and its entries
 * below; the dispatch in sampler.bpf.c expands the lists and names none of them.
 *
 * Each entry is X(name, NUMBER). name_forget(tgid) drops what user space said of a
 * process, at its exec and exit. By where its frames are found:
 *
 * - SONDE_JIT_RUNTIMES: its code lies on the native stack, which the native walk meets
 *   (a JIT's code cache, builtins without call frame information). The header defines
 *   struct name_proc (beginning with __u64 exec_id), its map name_procs keyed by tgid,
 *   name_in_code(p, pc), and the global function
 *   long name_frames(struct unwind_state *, struct user_frames *, struct name_proc *,
 *   __u32 pid, __u64 exec_id), which records the runtime's frames from the one at st->pc
 *   and leaves st at the first frame outside its code.
 * - SONDE_STATE_RUNTIMES: its frames are in its own state, which an activation of its
 *   code regions (interp_procs) on the native stack stands for (an interpreter's eval
 *   loop). The header defines the global function
 *   int name_frames(struct sample_event *, __u32 n, __u32 complete), which rewrites the
 *   sample's n native frames with the runtime's in and returns their new number.
 *
 * A runtime walked on one architecture only lists itself on that one. A runtime in both
 * lists (PHP: its VM's frames are state, its JIT's code is on the stack) names its JIT
 * entry <name>_jit, whose struct and map are the runtime's own by #define. */
#ifndef SONDE_RUNTIMES_H
#define SONDE_RUNTIMES_H

#include "statewalk.h"
#include "python.h"
#include "v8.h"
#include "jvm.h"
#include "php.h"
#include "ruby.h"

#define SONDE_RUNTIMES(X) X(python, PY_RUNTIME) X(v8, V8_RUNTIME) X(jvm, JVM_RUNTIME) X(php, PHP_RUNTIME) X(ruby, RUBY_RUNTIME)

#if defined(__TARGET_ARCH_x86)
#define SONDE_JIT_RUNTIMES(X) X(jvm, JVM_RUNTIME) X(v8, V8_RUNTIME) X(php_jit, PHP_RUNTIME) X(ruby_jit, RUBY_RUNTIME)
#else
#define SONDE_JIT_RUNTIMES(X) X(v8, V8_RUNTIME)
#endif

#define SONDE_STATE_RUNTIMES(X) X(python, PY_RUNTIME) X(php, PHP_RUNTIME) X(ruby, RUBY_RUNTIME)

#endif
