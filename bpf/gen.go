package bpf

// One object per architecture; bpf2go defines __TARGET_ARCH_x86 or __TARGET_ARCH_arm64, which
// arch.h turns into the architecture's header. asm/types.h is the same on both, so the host's
// headers serve either target.
//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64,arm64 -type sample_event -type process_event -type event_kind -type counter -type unwind_row -type row_index -type exec_mapping -type proc_info -type unwind_end -type cfa_rule -type fp_rule -type go_func -type go_runtime -type tracectx_proc -type tracectx_event -type tracectx_counter -type ctx_source -type tls_model -type go_labels_layout -type interp_proc -type offcpu_start -type offcpu_end_event -type go_park_key -type go_park -type interp_region -type interp_frame_encoding -type vma_event -type vma_hint -type vma_limits sampler sampler.bpf.c
