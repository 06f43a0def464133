/* Picks the architecture header for the target the object is compiled for. */
#if defined(__TARGET_ARCH_x86)
#include "arch_x86.h"
#elif defined(__TARGET_ARCH_arm64)
#include "arch_arm64.h"
#else
#error "sonde's kernel programs support x86 and arm64: compile with -D__TARGET_ARCH_x86 or -D__TARGET_ARCH_arm64"
#endif
