/* A kernel table built from the shared loops (csrc/bn_simd.c, every family)
 * over tests/c/vec_portable.h, the portable meaning of the primitives, at
 * lane counts the build machine's CPU may not have: vd is an array of LANES
 * doubles, vf of VF_LANES = 2 LANES floats, and the 2-byte storage types go
 * through storage.h's conversions, so every result is what an ISA with
 * those lane counts must give.  Its streaming stores abort on an address
 * less aligned than the primitive requires (PORTABLE_CHECK_ALIGN).
 * kernel_check.c, built with -DCFBN_HAVE_LANES and this file, checks the
 * table as it checks an ISA's; run.sh builds it with LANES = 2, 4 and 8
 * (NEON's, AVX2's and AVX-512's lane counts). */
#define PORTABLE_CHECK_ALIGN 1
#include "vec_portable.h"

#define STR2(x) #x
#define STR(x) STR2(x)
#define SIMD_TABLE cfbn_kernels_lanes
#define SIMD_NAME "lanes-vd" STR(LANES)
#include "bn_simd.c"
