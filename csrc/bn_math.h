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

/* Mean and biased variance from the shifted sums of n elements; NaN for an
 * empty batch.  A sum of squares rounded below s1^2/n is clamped at 0. */
CFBN_INLINE void cfbn_moments(double shift, double s1, double s2, long long n,
                              double *mean, double *var)
{
    if (n == 0) {
        *mean = CFBN_NAN_D;
        *var = CFBN_NAN_D;
        return;
    }
    double dn = (double)n;
    double m2 = s2 - s1 * (s1 / dn);
    *mean = shift + s1 / dn;
    *var = (m2 < 0.0 ? 0.0 : m2) / dn;
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

/* Gradient parameters of one channel from its sums: scale_backprop and the
 * a, b, c of cfbn_grad_dx.  An empty batch has zero sums but a NaN variance;
 * its scale_backprop is the empty sum 0, not 0 * NaN.  In inference b = c = 0
 * and dx = dy * a. */
CFBN_INLINE void cfbn_grad_params(int training, long long n, double gamma, double r,
                                  double sum_dy, double sum_dy_xc, double *scale_bp,
                                  double *a, double *b, double *c)
{
    double sbp = n > 0 ? sum_dy_xc * r : 0.0;
    *scale_bp = sbp;
    *a = gamma * r;
    if (training && n > 0) {
        double dn = (double)n;
        *b = -gamma * r * r * sbp / dn;
        *c = -gamma * r * sum_dy / dn;
    } else {
        *b = 0.0;
        *c = 0.0;
    }
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
