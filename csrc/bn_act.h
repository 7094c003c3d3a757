/* Per-element activation math, the definition every vectorized version is
 * tested against.  Static inline so that each file including it keeps a
 * private copy (an ISA file compiles it with its own flags; see STYLE.md).
 *
 * NaN propagates: each function compares so that a NaN argument falls
 * through to a NaN result (relu(NaN) is NaN, as in PyTorch and TensorFlow),
 * and derivatives of a NaN pre-activation are NaN, so a NaN in x reaches
 * every gradient output of its channel.
 *
 * Kinks, as TensorFlow and PyTorch define them: relu'(0) = 0,
 * relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = alpha, elu'(0) = alpha. */
#ifndef CFBN_BN_ACT_H
#define CFBN_BN_ACT_H

#include <math.h>

#include "cfbn.h"

static inline float cfbn_act_f32(int kind, float v, float alpha)
{
    switch (kind) {
    case CFBN_ACT_RELU: return v < 0.0f ? 0.0f : v;
    case CFBN_ACT_RELU6: return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case CFBN_ACT_LEAKY_RELU: return v < 0.0f ? alpha * v : v;
    /* expm1: exp(v) - 1 would cancel to a few ulps of 1 for v near 0 */
    case CFBN_ACT_ELU: return v < 0.0f ? alpha * expm1f(v) : v;
    case CFBN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case CFBN_ACT_TANH: return tanhf(v);
    case CFBN_ACT_SILU: return v / (1.0f + expf(-v));
    default: return v;
    }
}

/* d act / d v */
static inline float cfbn_act_grad_f32(int kind, float v, float alpha)
{
    switch (kind) {
    case CFBN_ACT_RELU: return v > 0.0f ? 1.0f : (v <= 0.0f ? 0.0f : v);
    case CFBN_ACT_RELU6: return (v > 0.0f && v < 6.0f) ? 1.0f : (v == v ? 0.0f : v);
    case CFBN_ACT_LEAKY_RELU: return v > 0.0f ? 1.0f : (v <= 0.0f ? alpha : v);
    case CFBN_ACT_ELU: return v > 0.0f ? 1.0f : alpha * expf(v);
    case CFBN_ACT_SIGMOID: {
        float s = 1.0f / (1.0f + expf(-v));
        return s * (1.0f - s);
    }
    case CFBN_ACT_TANH: {
        float t = tanhf(v);
        return 1.0f - t * t;
    }
    case CFBN_ACT_SILU: {
        float s = 1.0f / (1.0f + expf(-v));
        return s * (1.0f + v * (1.0f - s));
    }
    default: return 1.0f;
    }
}

static inline double cfbn_act_f64(int kind, double v, double alpha)
{
    switch (kind) {
    case CFBN_ACT_RELU: return v < 0.0 ? 0.0 : v;
    case CFBN_ACT_RELU6: return v < 0.0 ? 0.0 : (v > 6.0 ? 6.0 : v);
    case CFBN_ACT_LEAKY_RELU: return v < 0.0 ? alpha * v : v;
    case CFBN_ACT_ELU: return v < 0.0 ? alpha * expm1(v) : v;
    case CFBN_ACT_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case CFBN_ACT_TANH: return tanh(v);
    case CFBN_ACT_SILU: return v / (1.0 + exp(-v));
    default: return v;
    }
}

static inline double cfbn_act_grad_f64(int kind, double v, double alpha)
{
    switch (kind) {
    case CFBN_ACT_RELU: return v > 0.0 ? 1.0 : (v <= 0.0 ? 0.0 : v);
    case CFBN_ACT_RELU6: return (v > 0.0 && v < 6.0) ? 1.0 : (v == v ? 0.0 : v);
    case CFBN_ACT_LEAKY_RELU: return v > 0.0 ? 1.0 : (v <= 0.0 ? alpha : v);
    case CFBN_ACT_ELU: return v > 0.0 ? 1.0 : alpha * exp(v);
    case CFBN_ACT_SIGMOID: {
        double s = 1.0 / (1.0 + exp(-v));
        return s * (1.0 - s);
    }
    case CFBN_ACT_TANH: {
        double t = tanh(v);
        return 1.0 - t * t;
    }
    case CFBN_ACT_SILU: {
        double s = 1.0 / (1.0 + exp(-v));
        return s * (1.0 + v * (1.0 - s));
    }
    default: return 1.0;
    }
}

#endif
