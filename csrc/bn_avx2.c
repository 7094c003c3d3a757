/* AVX2 + FMA + F16C kernels: vec_avx2.h's primitives under the shared loops
 * (bn_simd.c).  Only this file is compiled with -mavx2 -mfma -mf16c, and
 * everything in it is static except the table: a helper with external
 * linkage could be merged with a baseline copy by the linker and then run
 * on a CPU without AVX2. */
#include "cfbn.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "vec_avx2.h"
#define SIMD_TABLE cfbn_kernels_avx2
#define SIMD_NAME "avx2"
#include "bn_simd.c"
#endif
