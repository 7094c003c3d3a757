/* NEON kernels for the aarch64 baseline: vec_neon.h's primitives under the
 * shared loops (bn_simd.c).  Advanced SIMD and the half <-> float
 * conversions are architectural there, so no feature test is needed;
 * bfloat16 is converted by integer shifts, so ARMv8.6's BFCVT is not needed
 * either.  Everything static except the table. */
#include "cfbn.h"

#if defined(__aarch64__)
#include "vec_neon.h"
#define SIMD_TABLE cfbn_kernels_neon
#define SIMD_NAME "neon"
#include "bn_simd.c"
#endif
