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

/* CFBN_ACT_SPECIALIZE(kind, CALL): CALL(k) with k the constant equal to kind,
 * so that a vectorized loop written for a `kind` argument is compiled once
 * per activation and the choice is made once per call rather than per
 * vector.  A case per member of enum cfbn_activation and no default: a new
 * activation is a compile error here until it has its case (a code outside
 * the enum never reaches a kernel: cfbn._args validates every call). */
#define CFBN_ACT_SPECIALIZE(kind, CALL)                          \
    switch ((enum cfbn_activation)(kind)) {                      \
    case CFBN_ACT_NONE: CALL(CFBN_ACT_NONE); break;              \
    case CFBN_ACT_RELU: CALL(CFBN_ACT_RELU); break;              \
    case CFBN_ACT_RELU6: CALL(CFBN_ACT_RELU6); break;            \
    case CFBN_ACT_LEAKY_RELU: CALL(CFBN_ACT_LEAKY_RELU); break;  \
    case CFBN_ACT_ELU: CALL(CFBN_ACT_ELU); break;                \
    case CFBN_ACT_SIGMOID: CALL(CFBN_ACT_SIGMOID); break;        \
    case CFBN_ACT_TANH: CALL(CFBN_ACT_TANH); break;              \
    case CFBN_ACT_SILU: CALL(CFBN_ACT_SILU); break;              \
    }

#endif
