/* Per-element activation math, the definition every vectorized version is
 * tested against: cfbn_act_f32, cfbn_act_grad_f32, cfbn_act_f64 and
 * cfbn_act_grad_f64.  The formulas live in bn_math.h, whose C branch makes
 * them static inline (each file including this keeps a private copy, so an
 * ISA file compiles them with its own flags; see docs/contributing.md) and whose CUDA
 * branch is the CuPy kernels' preamble: the CPU and the GPU run one
 * definition of each.  bn_math.h documents NaN propagation and the
 * derivatives at the kinks. */
#ifndef CFBN_BN_ACT_H
#define CFBN_BN_ACT_H

#include <math.h>

/* enum cfbn_activation, which bn_math.h's activations switch on */
#include "cfbn.h"
#include "bn_math.h"

/* Whether the activation's derivative is a compare (a constant piece by
 * piece), cheap enough that the gradient's policies treat it as no
 * arithmetic: bn_route.c (storing g) and bn_simd_fused.c (streaming). */
static inline int cfbn_act_grad_is_compare(int act)
{
    switch ((enum cfbn_activation)act) {
    case CFBN_ACT_NONE:
    case CFBN_ACT_RELU:
    case CFBN_ACT_RELU6:
    case CFBN_ACT_LEAKY_RELU: return 1;
    case CFBN_ACT_ELU:
    case CFBN_ACT_SIGMOID:
    case CFBN_ACT_TANH:
    case CFBN_ACT_SILU: return 0;
    }
    return 0;
}

#endif
