package bpf

//go:generate go tool bpf2go -cc clang-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -type sample_event -type process_event -type event_kind -type counter sampler sampler.bpf.c
