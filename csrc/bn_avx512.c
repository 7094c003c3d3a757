/* AVX-512 (F, BW, VL, DQ) + FMA + F16C kernels: vec_avx512.h's primitives
 * under the shared loops (bn_simd.c).  Only this file is compiled with the
 * AVX-512 flags; everything in it is static except the table, as in
 * bn_avx2.c.  Built with -DCFBN_VEC_SIMDE instead, SIMDe emulates the
 * intrinsics (tests/c/run.sh: the table checked on CPUs without AVX-512). */
#include "cfbn.h"

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
     defined(__FMA__) && defined(__F16C__)) || defined(CFBN_VEC_SIMDE)
#include "vec_avx512.h"
#define SIMD_TABLE cfbn_kernels_avx512
#define SIMD_NAME "avx512"
#include "bn_simd.c"
#endif
