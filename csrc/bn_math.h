/* The per-element and per-channel arithmetic of batch normalization, written
 * once for two compilers: C11 (the CPU kernels) and CUDA C++ under NVRTC (the
 * CuPy kernels take this file as their preamble).  Keep it free of includes
 * in the CUDA branch: NVRTC has no system headers, and CuPy's own headers
 * come before the preamble.
 *
 * Naming: _f works in float (float32 and float16 data), _d in double.
 *
 *   center      x - mean as (x - mhi) - mlo, with mhi + mlo the mean split
 *               into two numbers of the compute type: x - mhi is exact when x
 *               is near the mean (Sterbenz), so |mean| >> std keeps precision
 *   normalize   y  = center(x) * alpha + beta
 *   grad_dx     dx = dy * a + (center(x) * b + c)
 *   gg_dx       second-order dx = g * a2 + (q * b2 + (center(x) * c2 + e2))
 *   act         the fused activations and their derivatives (the C kernels'
 *               definition too, through bn_act.h)
 *   fused_y     y = act(normalize(x) + side)
 *   fused_g     g = dy * act'(pre-activation), the gradient's dy when fused
 *
 * Per-channel helpers work in double, as the C driver does.
 */
#ifndef CFBN_BN_MATH_H
#define CFBN_BN_MATH_H

#if defined(__CUDACC__)
/* Not static: NVRTC warns about every unreferenced static function, and each
 * kernel uses only a few of these. */
#define CFBN_INLINE __device__ __forceinline__
/* 0x7ff8...: the quiet NaN; NVRTC has no <math.h> and so no NAN macro. */
#define CFBN_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#else
#include <math.h>
#define CFBN_INLINE static inline
#define CFBN_NAN_D ((double)NAN)
#endif
/* The largest finite float and double, written out: NVRTC has no <float.h>. */
#define CFBN_FLT_MAX 3.40282347e+38f
#define CFBN_DBL_MAX 1.7976931348623157e+308

/* ---- per element ---- */

CFBN_INLINE float cfbn_center_f(float x, float mhi, float mlo)
{
    return (x - mhi) - mlo;
}

CFBN_INLINE double cfbn_center_d(double x, double mhi, double mlo)
{
    return (x - mhi) - mlo;
}

CFBN_INLINE float cfbn_normalize_f(float x, float mhi, float mlo, float alpha, float beta)
{
    return cfbn_center_f(x, mhi, mlo) * alpha + beta;
}

CFBN_INLINE double cfbn_normalize_d(double x, double mhi, double mlo, double alpha, double beta)
{
    return cfbn_center_d(x, mhi, mlo) * alpha + beta;
}

CFBN_INLINE float cfbn_grad_dx_f(float dy, float x, float mhi, float mlo, float a, float b, float c)
{
    return dy * a + (cfbn_center_f(x, mhi, mlo) * b + c);
}

CFBN_INLINE double cfbn_grad_dx_d(double dy, double x, double mhi, double mlo,
                                  double a, double b, double c)
{
    return dy * a + (cfbn_center_d(x, mhi, mlo) * b + c);
}

/* Statistics: sums of d = x - shift and d^2 in double, shift a sample of the
 * channel, so a large mean does not cancel the spread away. */
CFBN_INLINE void cfbn_stats_add(double x, double shift, double *s1, double *s2)
{
    double d = x - shift;
    *s1 += d;
    *s2 += d * d;
}

/* Gradient sums: dy and dy * center(x), the centering in the compute type and
 * the product in double. */
CFBN_INLINE void cfbn_gstats_add_f(float dy, float x, float mhi, float mlo, double *s1, double *s2)
{
    float d = cfbn_center_f(x, mhi, mlo);
    *s1 += (double)dy;
    *s2 += (double)dy * (double)d;
}

CFBN_INLINE void cfbn_gstats_add_d(double dy, double x, double mhi, double mlo, double *s1, double *s2)
{
    *s1 += dy;
    *s2 += dy * cfbn_center_d(x, mhi, mlo);
}

/* Second-order gradient: the five sums of cfbn_grad_grad_params, s[0..5) +=
 * g, g * d, q, q * d, q * g with d = center(x) (g = dy, q = ggx), centered in
 * the compute type and multiplied in double, as the gradient's sums. */
CFBN_INLINE void cfbn_ggstats_add_f(float g, float q, float x, float mhi, float mlo, double *s)
{
    double d = (double)cfbn_center_f(x, mhi, mlo), gd = (double)g, qd = (double)q;
    s[0] += gd;
    s[1] += gd * d;
    s[2] += qd;
    s[3] += qd * d;
    s[4] += qd * gd;
}

CFBN_INLINE void cfbn_ggstats_add_d(double g, double q, double x, double mhi, double mlo, double *s)
{
    double d = cfbn_center_d(x, mhi, mlo);
    s[0] += g;
    s[1] += g * d;
    s[2] += q;
    s[3] += q * d;
    s[4] += q * g;
}

/* The second-order x_backprop, dx = g * a2 + (q * b2 + (center(x) * c2 + e2)),
 * with cfbn_grad_grad_params' a2, b2, c2, e2.  Its y_backprop_backprop,
 * q * a1 + (center(x) * b1 + c1), is cfbn_grad_dx of q with a1, b1, c1. */
CFBN_INLINE float cfbn_gg_dx_f(float g, float q, float x, float mhi, float mlo, float a2, float b2,
                               float c2, float e2)
{
    return g * a2 + (q * b2 + (cfbn_center_f(x, mhi, mlo) * c2 + e2));
}

CFBN_INLINE double cfbn_gg_dx_d(double g, double q, double x, double mhi, double mlo, double a2,
                                double b2, double c2, double e2)
{
    return g * a2 + (q * b2 + (cfbn_center_d(x, mhi, mlo) * c2 + e2));
}

/* ---- per channel ---- */

/* The mean split into float hi + lo whose sum is the mean to about twice
 * float precision.  For double compute, hi = mean and lo = 0. */
CFBN_INLINE float cfbn_mean_hi_f(double mean)
{
    return (float)mean;
}

CFBN_INLINE float cfbn_mean_lo_f(double mean)
{
    return (float)(mean - (double)(float)mean);
}

/* Mean and m2 = sum((x - mean)^2) from the shifted sums of n elements; NaN
 * for an empty batch.  A sum of squares rounded below s1^2/n is clamped at 0. */
CFBN_INLINE void cfbn_mean_m2(double shift, double s1, double s2, long long n,
                              double *mean, double *m2)
{
    if (n == 0) {
        *mean = CFBN_NAN_D;
        *m2 = CFBN_NAN_D;
        return;
    }
    double dn = (double)n;
    double m = s2 - s1 * (s1 / dn);
    *mean = shift + s1 / dn;
    *m2 = m < 0.0 ? 0.0 : m;
}

/* Mean and biased variance from the shifted sums of n elements. */
CFBN_INLINE void cfbn_moments(double shift, double s1, double s2, long long n,
                              double *mean, double *var)
{
    double m2;
    cfbn_mean_m2(shift, s1, s2, n, mean, &m2);
    *var = m2 / (double)n;
}

/* Bessel-corrected variance; the factor n/(n-1) is taken as 1 when n <= 1. */
CFBN_INLINE double cfbn_unbiased(double var, long long n)
{
    return n > 1 ? var * ((double)n / ((double)n - 1.0)) : var;
}

/* Running average: (1 - f) * running + f * batch, or batch itself when f = 1
 * (the running value may then be absent, or NaN, and must not leak in). */
CFBN_INLINE double cfbn_running(double f, double running, double batch)
{
    return f != 1.0 ? (1.0 - f) * running + f * batch : batch;
}

CFBN_INLINE double cfbn_rstd(double var, double epsilon)
{
    return 1.0 / sqrt(var + epsilon);
}

/* A channel's training statistics from its mean and m2 over n elements: the
 * biased variance (the reserve space) and the running outputs, the mean and
 * the Bessel-corrected variance averaged with factor f (cfbn_running).  An
 * empty batch (m2 NaN) gives NaN. */
CFBN_INLINE void cfbn_train_stats(long long n, double mean, double m2, double f, double run_mean,
                                  double run_var, double *var, double *batch_mean, double *batch_var)
{
    double v = m2 / (double)n;
    *var = v;
    *batch_mean = cfbn_running(f, run_mean, mean);
    *batch_var = cfbn_running(f, run_var, cfbn_unbiased(v, n));
}

/* Gradient parameters of one channel from its sums: scale_backprop and the
 * a, b, c of cfbn_grad_dx (cfbn_grad_coeffs: from sum_dy and
 * sum_dy_xhat = scale_backprop, over all n elements of the batch).  An
 * empty batch has zero sums but a NaN variance; its scale_backprop is the
 * empty sum 0, not 0 * NaN.  In inference b = c = 0
 * and dx = dy * a.  With one element per channel in training, n * dy and
 * sum_dy are the same number, so a = c = 0 and dx = b * (x - mean): exactly 0
 * when mean is that element (as TensorFlow gives), where a * dy + c would
 * leave rounding noise of a few ulps of gamma * r * dy.  (A NaN or Inf in dy
 * still reaches dx through 0 * dy.) */
CFBN_INLINE void cfbn_grad_coeffs(int training, long long n, double gamma, double r,
                                  double sum_dy, double sum_dy_xhat, double *a, double *b, double *c)
{
    *a = gamma * r;
    if (training && n > 0) {
        double dn = (double)n;
        *b = -gamma * r * r * sum_dy_xhat / dn;
        *c = -gamma * r * sum_dy / dn;
        if (n == 1) {
            *a = 0.0;
            *c = 0.0;
        }
    } else {
        *b = 0.0;
        *c = 0.0;
    }
}

CFBN_INLINE void cfbn_grad_params(int training, long long n, double gamma, double r,
                                  double sum_dy, double sum_dy_xc, double *scale_bp,
                                  double *a, double *b, double *c)
{
    double sbp = n > 0 ? sum_dy_xc * r : 0.0;
    *scale_bp = sbp;
    cfbn_grad_coeffs(training, n, gamma, r, sum_dy, sbp, a, b, c);
}

/* Second-order gradient parameters of one channel (cfbn.h's cfbn_gg_*,
 * docs/spec.md) from its five sums over n elements, with d = x - mean:
 * sum(g), sum(g * d), sum(q), sum(q * d), sum(q * g) (g = dy, q = ggx).
 * Outputs scale_backprop and k[0..7) = a1, b1, c1, a2, b2, c2, e2 of
 *   ddy = q * a1 + d * b1 + c1,  dx = g * a2 + q * b2 + d * c2 + e2.
 * With one element per channel in training, d = 0 and the exact ddy is
 * ggoffset and dx is 0: a1 = a2 = b2 = e2 = 0 and c1 = ggoffset keep
 * rounding noise out of both, as cfbn_grad_coeffs does.  An empty batch's
 * scale_backprop is the empty sum 0. */
CFBN_INLINE void cfbn_grad_grad_params(int training, long long n, double gamma, double r, double ggscale,
                                       double ggoffset, const double *s, double *scale_bp, double *k)
{
    double dn = (double)n;
    if (!training) {
        *scale_bp = n > 0 ? r * s[4] : 0.0;
        k[0] = gamma * r;          /* a1 */
        k[1] = ggscale * r;        /* b1 */
        k[2] = ggoffset;           /* c1 */
        k[3] = ggscale * r;        /* a2 */
        k[4] = k[5] = k[6] = 0.0;  /* b2, c2, e2 */
        return;
    }
    if (n <= 0) {
        *scale_bp = 0.0;
        for (int j = 0; j < 7; j++) k[j] = 0.0;
        return;
    }
    double A = s[0] / dn, B = s[1] * r / dn, Aq = s[2] / dn, Cq = s[3] * r / dn, D = s[4] / dn;
    double gr = gamma * r, grr = gr * r;
    *scale_bp = dn * r * (D - Aq * A - Cq * B);
    k[0] = gr;
    k[1] = ggscale * r - grr * Cq;
    k[2] = ggoffset - gr * Aq;
    k[3] = ggscale * r - grr * Cq;
    k[4] = -grr * B;
    k[5] = grr * r * (Aq * A + 3.0 * B * Cq - D) - ggscale * r * r * B;
    k[6] = grr * (Cq * A + B * Aq) - ggscale * r * A;
    if (n == 1) {
        k[0] = 0.0;
        k[2] = ggoffset;
        k[3] = 0.0;
        k[4] = 0.0;
        k[6] = 0.0;
    }
}

/* ---- fused activation and side input ----
 *
 * The activations, switching on enum cfbn_activation (a case for each
 * member, no default: a code outside the enum gives NaN), which must be declared
 * before this header: cfbn.h in C (bn_act.h includes both), the first lines
 * of the CuPy preamble in CUDA (cfbn._gpu writes them from the codes that
 * cfbn._api passes to both targets).
 *
 * NaN propagates: each function compares so that a NaN argument falls
 * through to a NaN result (relu(NaN) is NaN, as in PyTorch and TensorFlow),
 * and derivatives of a NaN pre-activation are NaN, so a NaN in x reaches
 * every gradient output of its channel.
 *
 * Kinks, as TensorFlow and PyTorch define them: relu'(0) = 0,
 * relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = alpha, elu'(0) = alpha. */

CFBN_INLINE float cfbn_act_f32(int kind, float v, float alpha)
{
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return v;
    case CFBN_ACT_RELU: return v < 0.0f ? 0.0f : v;
    case CFBN_ACT_RELU6: return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case CFBN_ACT_LEAKY_RELU: return v < 0.0f ? alpha * v : v;
    /* expm1: exp(v) - 1 would cancel to a few ulps of 1 for v near 0 */
    case CFBN_ACT_ELU: return v < 0.0f ? alpha * expm1f(v) : v;
    case CFBN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case CFBN_ACT_TANH: return tanhf(v);
    /* v held above -FLT_MAX: -Inf / Inf would be NaN where the limit is -0 */
    case CFBN_ACT_SILU: return (v < -CFBN_FLT_MAX ? -CFBN_FLT_MAX : v) / (1.0f + expf(-v));
    }
    return (float)CFBN_NAN_D;   /* a code outside the enum */
}

/* d act / d v */
CFBN_INLINE float cfbn_act_grad_f32(int kind, float v, float alpha)
{
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return 1.0f;
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
        /* v held to the finite range: at +-Inf, v (1 - s) is Inf 0, where
         * silu' tends to 1 and 0 */
        float s = 1.0f / (1.0f + expf(-v));
        float w = v < -CFBN_FLT_MAX ? -CFBN_FLT_MAX : (v > CFBN_FLT_MAX ? CFBN_FLT_MAX : v);
        return s * (1.0f + w * (1.0f - s));
    }
    }
    return (float)CFBN_NAN_D;   /* a code outside the enum */
}

CFBN_INLINE double cfbn_act_f64(int kind, double v, double alpha)
{
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return v;
    case CFBN_ACT_RELU: return v < 0.0 ? 0.0 : v;
    case CFBN_ACT_RELU6: return v < 0.0 ? 0.0 : (v > 6.0 ? 6.0 : v);
    case CFBN_ACT_LEAKY_RELU: return v < 0.0 ? alpha * v : v;
    case CFBN_ACT_ELU: return v < 0.0 ? alpha * expm1(v) : v;
    case CFBN_ACT_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case CFBN_ACT_TANH: return tanh(v);
    case CFBN_ACT_SILU: return (v < -CFBN_DBL_MAX ? -CFBN_DBL_MAX : v) / (1.0 + exp(-v));
    }
    return CFBN_NAN_D;   /* a code outside the enum */
}

CFBN_INLINE double cfbn_act_grad_f64(int kind, double v, double alpha)
{
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return 1.0;
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
        double w = v < -CFBN_DBL_MAX ? -CFBN_DBL_MAX : (v > CFBN_DBL_MAX ? CFBN_DBL_MAX : v);
        return s * (1.0 + w * (1.0 - s));
    }
    }
    return CFBN_NAN_D;   /* a code outside the enum */
}

/* y = act(normalize(x) + side).  The side input is added only when there is
 * one, so a zero pre-activation keeps its sign (relu(-0) is -0, as on the
 * CPU, where the plain value goes to the activation as it is). */
CFBN_INLINE float cfbn_fused_y_f(int kind, float act_alpha, float x, int has_side, float side,
                                 float mhi, float mlo, float alpha, float beta)
{
    float v = cfbn_normalize_f(x, mhi, mlo, alpha, beta);
    if (has_side) v += side;
    return cfbn_act_f32(kind, v, act_alpha);
}

CFBN_INLINE double cfbn_fused_y_d(int kind, double act_alpha, double x, int has_side, double side,
                                  double mhi, double mlo, double alpha, double beta)
{
    double v = cfbn_normalize_d(x, mhi, mlo, alpha, beta);
    if (has_side) v += side;
    return cfbn_act_f64(kind, v, act_alpha);
}

/* g = dy * act'(pre), what the gradient's sums and dx take in place of dy.
 * The pre-activation is recomputed from x with the forward's per-channel
 * alpha (ya = scale * rstd) and beta (yb = offset), plus the side input when
 * there is one.  Without an activation g = dy (the side input then only
 * passes dy through to side_input_backprop). */
CFBN_INLINE float cfbn_fused_g_f(int kind, float act_alpha, float dy, float x, int has_side,
                                 float side, float mhi, float mlo, float ya, float yb)
{
    if (kind == CFBN_ACT_NONE) return dy;
    float v = cfbn_normalize_f(x, mhi, mlo, ya, yb);
    if (has_side) v += side;
    return dy * cfbn_act_grad_f32(kind, v, act_alpha);
}

CFBN_INLINE double cfbn_fused_g_d(int kind, double act_alpha, double dy, double x, int has_side,
                                  double side, double mhi, double mlo, double ya, double yb)
{
    if (kind == CFBN_ACT_NONE) return dy;
    double v = cfbn_normalize_d(x, mhi, mlo, ya, yb);
    if (has_side) v += side;
    return dy * cfbn_act_grad_f64(kind, v, act_alpha);
}

/* ---- element index -> channel ---- */

/* 64-bit integer division is a long emulated sequence on GPUs; when every
 * operand fits in 32 bits the 32-bit division gives the same quotient. */
CFBN_INLINE long long cfbn_channel_last(long long i, long long channels)
{
    if ((unsigned long long)(i | channels) <= 0xffffffffULL)
        return (long long)((unsigned int)i % (unsigned int)channels);
    return i % channels;
}

CFBN_INLINE long long cfbn_channel_first(long long i, long long inner, long long channels)
{
    if ((unsigned long long)(i | inner | channels) <= 0xffffffffULL)
        return (long long)(((unsigned int)i / (unsigned int)inner) % (unsigned int)channels);
    return (i / inner) % channels;
}

#endif
