/* The rules of cfbn's scalar arguments, each stated once: a range, its
 * predicate and the words of what it expects.
 *
 * Every entrance checks its scalar arguments with these and, where one
 * fails, says "<name>: expected <CFBN_EXPECT_...>, got <value>":
 *   cfbn._args, their Python face (through cfbn._kernels), which the NumPy,
 *       CuPy and split calls, cfbn.distributed, cfbn.layer and cfbn.torch's
 *       Python checks and fake kernels use;
 *   the Cython fast paths, which take a call only where these hold (any
 *       other goes to cfbn._args for its error);
 *   cfbn.torch's C++ operators (csrc/torch_ops.cpp).
 * Header only: the C++ operator library does not link cfbn's C core.
 * Predicates below; a NaN fails each. */
#ifndef CFBN_RULES_H
#define CFBN_RULES_H

#include <float.h>
#include <limits.h>

#include "cfbn.h"  /* CFBN_ACT_COUNT */

/* Each rule is a closed range [LO, HI] (a NaN lies in none) and the words
 * of it.  cfbn._args compares with the same bounds (cfbn._kernels.RULES),
 * so that a Python caller traced by torch.compile sees plain comparisons. */
#define CFBN_EPSILON_LO 0.0       /* epsilon, added to the variance: finite, >= 0 */
#define CFBN_EPSILON_HI DBL_MAX
#define CFBN_EXPECT_EPSILON "a finite value >= 0"

#define CFBN_FACTOR_LO 0.0        /* exponential_avg_factor: the batch's weight */
#define CFBN_FACTOR_HI 1.0
#define CFBN_EXPECT_FACTOR "a value in [0, 1]"

#define CFBN_FINITE_LO (-DBL_MAX) /* alpha (leaky_relu's slope, elu's scale), torch's momentum */
#define CFBN_FINITE_HI DBL_MAX
#define CFBN_EXPECT_FINITE "a finite value"

#define CFBN_THREADS_LO 1         /* n_threads, where given */
#define CFBN_THREADS_HI 1024
#define CFBN_EXPECT_THREADS "at least 1 and at most 1024"

#define CFBN_COUNT_LO 0           /* num_batches_tracked: momentum None weighs by 1 / count */
#define CFBN_COUNT_HI LLONG_MAX
#define CFBN_EXPECT_COUNT "a count >= 0"

/* an activation code (enum cfbn_activation): the C API does not check it,
 * and an unknown one would leave the output unwritten */
#define CFBN_ACTIVATION_LO 0
#define CFBN_ACTIVATION_HI (CFBN_ACT_COUNT - 1)
#define CFBN_EXPECT_ACTIVATION "a code in [0, 8)"

/* The texts name these numbers: a change to one fails to compile here. */
typedef char cfbn_rules_texts_hold[CFBN_ACT_COUNT == 8 && CFBN_THREADS_HI == 1024 ? 1 : -1];

static inline int cfbn_epsilon_ok(double e)
{
    return e >= CFBN_EPSILON_LO && e <= CFBN_EPSILON_HI;
}

static inline int cfbn_factor_ok(double f)
{
    return f >= CFBN_FACTOR_LO && f <= CFBN_FACTOR_HI;
}

static inline int cfbn_finite_ok(double v)
{
    return v >= CFBN_FINITE_LO && v <= CFBN_FINITE_HI;
}

static inline int cfbn_threads_ok(long long n)
{
    return n >= CFBN_THREADS_LO && n <= CFBN_THREADS_HI;
}

static inline int cfbn_count_ok(long long n)
{
    return n >= CFBN_COUNT_LO;
}

static inline int cfbn_activation_ok(long long code)
{
    return code >= CFBN_ACTIVATION_LO && code <= CFBN_ACTIVATION_HI;
}

#endif
