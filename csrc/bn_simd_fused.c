/* The fused loops (activation and side input inside the normalization's
 * loop: the *_fused entries) and the loops over several runs of a channel
 * (the *_runs and *_runs_fused entries), written once for every ISA over the
 * float primitives of the ISA's header (vf, VF_LANES, vf_ld, vf_blend, ...)
 * and the plain loops' helpers (apply_ps, gstats_step, accf, lanes_ps, ...),
 * which the including file has defined before it.  Nothing here names an
 * instruction set.  The storage type dt is a constant of each entry, as in
 * the plain loops (bn_entries.h).
 *
 * A flat stream (a run, or rows whose width divides 2 VF_LANES) alternates
 * two parameter sets over blocks of VF_LANES elements, even blocks then odd
 * ones, so that every lane always sees the same column. */
#ifndef VF_LANES
#error "bn_simd_fused.c is included after an ISA's vec_<isa>.h and the plain loops"
#endif

/* ---- fused activations (f32, f16 and bf16 tensors) ----
 * exp as in Cephes' expf: e^x = 2^k e^r with k = round(x / ln 2), r = x - k ln 2
 * formed in two FMA steps (ln 2 = C1 + C2, C1 with few bits so k * C1 is
 * exact), e^r by a degree-6 polynomial on |r| <= ln 2 / 2, 2^k put into the
 * exponent bits.  About 1 ulp on the clamped range; the clamp keeps 2^k a
 * normal number (k in [-126, 127]); outside it the activations below are
 * flat to float precision anyway, and the result is +inf above the clamp
 * and 0 below it rather than the clamp's e^88 or e^-87.34: the activations
 * and derivatives whose true values then lie below float's normal range
 * (sigmoid and silu at v < -88, elu' at v < -87.3) are exactly 0, as the
 * reference rounds them in every storage type, where the clamp's value
 * would give a float that is not theirs (1 / (1 + e^88) = 6e-39, which
 * bfloat16 keeps).  Only between those points and about -104, where the
 * true value is a float32 or bfloat16 subnormal, do the kernels give 0 for
 * it (docs/numerics.md).  min/max take the NaN operand second so a NaN
 * stays NaN (and is neither above nor below the clamp). */
INLINE vf exp_ps(vf x)
{
    const vf_mask over = vf_gt(x, vf_set1(88.0f)), under = vf_lt(x, vf_set1(-87.33654f));
    x = vf_max(vf_set1(-87.33654f), vf_min(vf_set1(88.0f), x));
    vf k = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnma(k, vf_set1(0.693359375f), x);
    r = vf_fnma(k, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fma(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fma(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fma(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fma(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fma(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fma(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_blend(vf_blend(vf_mul(p, vf_exp2i(k)), vf_zero(), under), vf_set1(INFINITY), over);
}

INLINE vf sigmoid_ps(vf v)
{
    const vf one = vf_set1(1.0f);
    return vf_div(one, vf_add(one, exp_ps(vf_sub(vf_zero(), v))));
}

/* tanh: for |v| < 0.625 Cephes' odd polynomial v + v^3 P(v^2), because
 * 1 - 2/(e^2|v| + 1) loses relative precision as |v| -> 0; above, that
 * formula, whose error is then a couple of ulps of the result. */
INLINE vf tanh_ps(vf v)
{
    const vf sign = vf_set1(-0.0f), one = vf_set1(1.0f);
    vf a = vf_andnot(sign, v);
    vf z = vf_mul(v, v);
    vf p = vf_set1(-5.70498872745e-3f);
    p = vf_fma(p, z, vf_set1(2.06390887954e-2f));
    p = vf_fma(p, z, vf_set1(-5.37397155531e-2f));
    p = vf_fma(p, z, vf_set1(1.33314422036e-1f));
    p = vf_fma(p, z, vf_set1(-3.33332819422e-1f));
    vf small = vf_fma(vf_mul(p, z), v, v);
    vf e = exp_ps(vf_add(a, a));
    vf big = vf_sub(one, vf_div(vf_set1(2.0f), vf_add(e, one)));
    big = vf_or(big, vf_and(sign, v));
    return vf_blend(big, small, vf_lt(a, vf_set1(0.625f)));
}

INLINE vf act_ps(vf v, int kind, vf al)
{
    const vf zero = vf_zero(), one = vf_set1(1.0f);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return v;
    case CFBN_ACT_RELU: return vf_max(zero, v);
    case CFBN_ACT_RELU6: return vf_min(vf_set1(6.0f), vf_max(zero, v));
    case CFBN_ACT_LEAKY_RELU:
        return vf_blend(v, vf_mul(al, v), vf_lt(v, zero));
    case CFBN_ACT_ELU:
        return vf_blend(v, vf_mul(al, vf_sub(exp_ps(v), one)), vf_lt(v, zero));
    case CFBN_ACT_SIGMOID: return sigmoid_ps(v);
    case CFBN_ACT_TANH: return tanh_ps(v);
    case CFBN_ACT_SILU:
        /* v held above -FLT_MAX: -Inf / Inf would be NaN where the limit
         * is -0 (a pre-activation that overflowed float) */
        return vf_div(vf_max(v, vf_set1(-FLT_MAX)), vf_add(one, exp_ps(vf_sub(zero, v))));
    }
    return vf_set1(NAN);   /* a code outside the enum */
}

/* d act / d v; a NaN v gives NaN (the unordered mask's bits are all ones,
 * a NaN, OR-ed into the result) */
INLINE vf act_grad_ps(vf v, int kind, vf al)
{
    const vf zero = vf_zero(), one = vf_set1(1.0f);
    const vf nan = vf_mask_bits(vf_unord(v, v));
    const vf_mask pos = vf_gt(v, zero);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return one;
    case CFBN_ACT_RELU: return vf_or(vf_and(vf_mask_bits(pos), one), nan);
    case CFBN_ACT_RELU6: {
        vf in = vf_and(vf_mask_bits(pos), vf_mask_bits(vf_lt(v, vf_set1(6.0f))));
        return vf_or(vf_and(in, one), nan);
    }
    case CFBN_ACT_LEAKY_RELU: return vf_or(vf_blend(al, one, pos), nan);
    case CFBN_ACT_ELU: return vf_blend(vf_mul(al, exp_ps(v)), one, pos);
    case CFBN_ACT_SIGMOID: {
        vf s = sigmoid_ps(v);
        return vf_mul(s, vf_sub(one, s));
    }
    case CFBN_ACT_TANH: {
        vf t = tanh_ps(v);
        return vf_fnma(t, t, one);
    }
    case CFBN_ACT_SILU: {
        /* v held to float's finite range: at +-Inf (a pre-activation that
         * overflowed float) v (1 - s) is Inf 0, where silu' tends to 1 and 0 */
        vf s = sigmoid_ps(v), w = vf_min(vf_max(v, vf_set1(-FLT_MAX)), vf_set1(FLT_MAX));
        return vf_mul(s, vf_fma(w, vf_sub(one, s), one));
    }
    }
    return vf_set1(NAN);   /* a code outside the enum */
}

/* FUSED_SPECIALIZE(kind, side, CALL): CALL(k) with k the constant equal to
 * kind, so that a loop written for a `kind` argument is compiled once per
 * activation and the choice is made once per call, not per vector; CALL
 * passes `side != NULL` as the loops' side-input flag (hs).  A case per
 * member of enum cfbn_activation and no default: a new activation is a
 * compile error here until it has its case.
 * The cheap activations' loops are a few operations a vector, and a test of
 * hs in them cost up to 1.8x in L2: CALL is made in each branch of
 * `if (side)`, where hs is a constant, and each has a loop with a side input
 * and one without.  The exp family's arithmetic hides the test: one loop
 * serves both, which halves that family's code (the larger part of the fused
 * loops'). */
#define FUSED_SPECIALIZE(kind, side, CALL)                                                    \
    switch ((enum cfbn_activation)(kind)) {                                                   \
    case CFBN_ACT_NONE: if (side) CALL(CFBN_ACT_NONE); else CALL(CFBN_ACT_NONE); break;       \
    case CFBN_ACT_RELU: if (side) CALL(CFBN_ACT_RELU); else CALL(CFBN_ACT_RELU); break;       \
    case CFBN_ACT_RELU6: if (side) CALL(CFBN_ACT_RELU6); else CALL(CFBN_ACT_RELU6); break;    \
    case CFBN_ACT_LEAKY_RELU:                                                                 \
        if (side) CALL(CFBN_ACT_LEAKY_RELU); else CALL(CFBN_ACT_LEAKY_RELU); break;           \
    case CFBN_ACT_ELU: CALL(CFBN_ACT_ELU); break;                                             \
    case CFBN_ACT_SIGMOID: CALL(CFBN_ACT_SIGMOID); break;                                     \
    case CFBN_ACT_TANH: CALL(CFBN_ACT_TANH); break;                                           \
    case CFBN_ACT_SILU: CALL(CFBN_ACT_SILU); break;                                           \
    }

/* ---- fused activation and side input inside the vector loops ----
 * One pass per call, everything in registers: the pre-activation, the
 * activation or its derivative and the side input are formed in the loop
 * that reads x, so a fused call costs the plain call's memory traffic (plus
 * side's) and a few vector operations per element.  The activation kind and
 * the storage type are constants of each loop, and so is the presence of a
 * side input for the cheap activations (FUSED_SPECIALIZE above).
 *
 * The pre-activation is formed with the plain kernels' FMA, then side is
 * added and act_ps or act_grad_ps applied, element for element.  Every
 * vector is read in full before its position is written, so y may be x or
 * side, and dx and side_grad may be dy or x.
 *
 * The gradient sums are accumulated in double directly (gstats_step): the
 * product of two floats is exact in double, so there is no float block sum
 * that could leave float's range and no second pass to redo it; the
 * conversions it costs are hidden behind the activation's arithmetic and the
 * loads (benchmarks/fusion.py). */

/* The pre-activation's parameter set of one block of VF_LANES: mhi, mlo, alpha
 * (ya for the gradient), beta (yb). */
INLINE vf fused_pre_ps(vf x, vf s, const vf *q, int has_side)
{
    vf v = apply_ps(x, q[0], q[1], q[2], q[3]);
    return has_side ? vf_add(v, s) : v;
}

/* g = dy * act'(pre); dy itself without an activation (side unread then) */
INLINE vf fused_g_ps(vf dy, vf x, vf s, const vf *q, int kind, int has_side, vf al)
{
    if (kind == CFBN_ACT_NONE) return dy;
    return vf_mul(dy, act_grad_ps(fused_pre_ps(x, s, q, has_side), kind, al));
}

/* ya or yb, which are given only with an activation: without one they are
 * never used, and mhi (of the same w columns) stands in for them so that
 * the loops' parameter loads stay in bounds */
INLINE const float *yab_ps(const float *v, const cfbn_grad_f32 *p)
{
    return p->act != CFBN_ACT_NONE ? v : p->mhi;
}

/* A fused gradient's parameter arrays: mhi, mlo, ya, yb, then a, b, c,
 * which the sums kernels (the first 4) do not take */
#define FGRAD_ARRAYS(p) {(p)->mhi, (p)->mlo, yab_ps((p)->ya, p), yab_ps((p)->yb, p), (p)->a, (p)->b, (p)->c}

/* Whole vectors of fused outputs: with nt, non-temporal stores (outputs
 * 16-byte aligned at every vector, as vf_st_nt needs and the plain *_nt
 * kernels write when the router asks for streaming); tails use regular
 * stores. */
INLINE void st_out(void *p, int64_t i, vf v, int dt, int nt)
{
    if (nt) vf_st_nt(p, i, v, dt);
    else vf_st(p, i, v, dt);
}

/* Streaming for a fused call: asked for, and every vector of the outputs
 * (VF_LANES elements from the start of the call or of a row) 16-byte
 * aligned: rows of a multiple of 16 bytes. */
INLINE int fused_nt(int stream, int dt, const void *out, const void *out2, int64_t w)
{
    return stream && ((uintptr_t)out & 15) == 0 && ((uintptr_t)out2 & 15) == 0 && (w & (16 / (dt ? 2 : 4) - 1)) == 0;
}

/* Blocking factors, not lane counts.  TREE_VECS: the vectors that one
 * gstats_tree_step, fgstats_block or stats_block_add sums pairwise in
 * float, so the runs and stretches of a run summed that way go that many at
 * a time.
 * FUSED_ROWS: the rows of a block in the fused rows kernels, as the plain
 * rows kernels' blocks (prefetch_group_l2 fetches that many rows). */
#define TREE_VECS 8
#define FUSED_ROWS 8

/* ---- forward: y = act(pre + side) ---- */

/* The fused elementwise passes, forward (grad 0: y = act(pre + side), q =
 * mhi, mlo, alpha, beta) and gradient (grad 1: dx = g a + ((x - mhi) - mlo)
 * b + c, g stored to sg too where given; q = mhi, mlo, ya, yb, a, b, c),
 * written once as the plain ones are (out_ps).  nv (1, 2 or 4) whole
 * vectors from i, alternating the parameter sets q and q + FPAR(grad): all
 * of them read before any is written. */
#define FPAR(grad) ((grad) ? 7 : 4)

INLINE void fout_vecs(int grad, int nv, const void *dy, const void *x, const void *side, void *y, void *sg, int64_t i,
                      const vf *q, int kind, int hs, vf al, int dt, int nt)
{
    vf xv[4], sv[4], g[4], o[4];
    for (int v = 0; v < nv; v++) {
        xv[v] = vf_ld(x, i + v * VF_LANES, dt);
        sv[v] = hs ? vf_ld(side, i + v * VF_LANES, dt) : vf_zero();
    }
    for (int v = 0; v < nv; v++) {
        const vf *r = q + FPAR(grad) * (v & 1);
        if (!grad) {
            o[v] = act_ps(fused_pre_ps(xv[v], sv[v], r, hs), kind, al);
            continue;
        }
        g[v] = fused_g_ps(vf_ld(dy, i + v * VF_LANES, dt), xv[v], sv[v], r, kind, hs, al);
        o[v] = gapply_ps(g[v], xv[v], r[0], r[1], r[4], r[5], r[6]);
    }
    for (int v = 0; grad && sg && v < nv; v++) st_out(sg, i + v * VF_LANES, g[v], dt, nt);
    for (int v = 0; v < nv; v++) st_out(y, i + v * VF_LANES, o[v], dt, nt);
}

/* The first cnt elements from i (avail readable), with parameters r */
INLINE void fout_part(int grad, const void *dy, const void *x, const void *side, void *y, void *sg, int64_t i,
                      int64_t cnt, int64_t avail, const vf *r, int kind, int hs, vf al, int dt)
{
    vf x0 = vf_ld_part(x, i, cnt, avail, dt), s0 = hs ? vf_ld_part(side, i, cnt, avail, dt) : vf_zero();
    if (!grad) {
        vf_st_part(y, i, act_ps(fused_pre_ps(x0, s0, r, hs), kind, al), cnt, dt);
        return;
    }
    vf g0 = fused_g_ps(vf_ld_part(dy, i, cnt, avail, dt), x0, s0, r, kind, hs, al);
    if (sg) vf_st_part(sg, i, g0, cnt, dt);
    vf_st_part(y, i, gapply_ps(g0, x0, r[0], r[1], r[4], r[5], r[6]), cnt, dt);
}

/* A flat stream: q, the even blocks' set, then the odd blocks'; the forward
 * 4 vectors a step, the gradient 2 */
INLINE void fout_flat_ps(int grad, const void *dy, const void *x, const void *side, void *y, void *sg, int64_t n,
                         const vf *q, int kind, int hs, vf al, int dt, int nt)
{
    int64_t i = 0;
    for (; !grad && i + 4 * VF_LANES <= n; i += 4 * VF_LANES)
        fout_vecs(grad, 4, dy, x, side, y, sg, i, q, kind, hs, al, dt, nt);
    for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) fout_vecs(grad, 2, dy, x, side, y, sg, i, q, kind, hs, al, dt, nt);
    if (i + VF_LANES <= n) {
        fout_vecs(grad, 1, dy, x, side, y, sg, i, q, kind, hs, al, dt, nt);
        i += VF_LANES;
    }
    if (i < n)
        fout_part(grad, dy, x, side, y, sg, i, n - i, n - i, q + FPAR(grad) * ((i / VF_LANES) & 1), kind, hs, al, dt);
}

/* rows of a width that 2 VF_LANES does not divide: VF_LANES columns at a
 * time, a masked tail at the same columns of every row */
INLINE void fapply_rows_w_ps(const void *x, const void *side, void *y, int64_t rows, int64_t w,
                             const cfbn_apply_f32 *p, int kind, int hs, vf al, int dt, int nt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full, n = rows * w;
    const vf z = vf_zero();
    vf t[4];
    tail_params_ps(v, 4, full, cnt, t);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES) {
            vf q[4];
            col_params_ps(v, 4, j, q);
            /* written out, not fout_vecs: through it GCC made this loop
             * 1.3-1.4x slower in L2 with a side input (table_ab.sh) */
            vf x0 = vf_ld(x, o + j, dt), s0 = hs ? vf_ld(side, o + j, dt) : z;
            st_out(y, o + j, act_ps(fused_pre_ps(x0, s0, q, hs), kind, al), dt, nt);
        }
        if (cnt) fout_part(0, NULL, x, side, y, NULL, o + full, cnt, n - o - full, t, kind, hs, al, dt);
    }
}

INLINE void fapply_run_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const int nt = fused_nt(p->stream, dt, y, y, 0);
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    run_params_ps((const float *const[4])APPLY_ARRAYS(p), 4, q);
    const void *side = p->side;
#define FAPPLY_RUN(k) fout_flat_ps(0, NULL, x, side, y, NULL, n, q, k, side != NULL, al, dt, nt)
    FUSED_SPECIALIZE(p->act, side, FAPPLY_RUN)
#undef FAPPLY_RUN
    if (nt) stream_fence();
}

INLINE void fapply_rows_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    const int nt = fused_nt(p->stream, dt, y, y, w);
    if (w <= 0) return;
    const void *side = p->side;
    const vf al = vf_set1(p->act_alpha);
    if ((2 * VF_LANES) % w == 0) {
        const float *const v[4] = APPLY_ARRAYS(p);
        vf q[8];
        lanes_params_ps(v, 4, w, q);
#define FAPPLY_FLAT(k) fout_flat_ps(0, NULL, x, side, y, NULL, rows * w, q, k, side != NULL, al, dt, nt)
        FUSED_SPECIALIZE(p->act, side, FAPPLY_FLAT)
#undef FAPPLY_FLAT
        if (nt) stream_fence();
        return;
    }
#define FAPPLY_ROWS(k) fapply_rows_w_ps(x, side, y, rows, w, p, k, side != NULL, al, dt, nt)
    FUSED_SPECIALIZE(p->act, side, FAPPLY_ROWS)
#undef FAPPLY_ROWS
    if (nt) stream_fence();
}

/* ---- gradient sums: sum g, sum g * ((x - mhi) - mlo), in double ----
 * go (cfbn_grad_f32.g_out): NULL, or where each g summed is also stored.
 * The loops that prefetch their inputs prefetch go's lines with them:
 * without, the stores waited on their lines (perf: a quarter of the rows
 * loop's samples on one store); (32,28,28,128) NHWC, relu with a side
 * input, gradient, one thread: 4.4-5.4 -> 3.7-3.8 ms (plain: 2.4 ms). */

INLINE void st_g(void *go, int64_t i, vf g, int dt)
{
    if (go) vf_st(go, i, g, dt);
}

INLINE void st_g_part(void *go, int64_t i, vf g, int64_t cnt, int dt)
{
    if (go) vf_st_part(go, i, g, cnt, dt);
}

/* q: mhi, mlo, ya, yb of even blocks, then of odd blocks */
INLINE void fgstats_flat_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                            int kind, int hs, vf al, int dt, accf *ea, accf *oa)
{
    const vf z = vf_zero();
    accf a = accf_zero(), b = accf_zero();
    int64_t i = 0;
    for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {
        prefetch_step_ahead_of(x, i, dt);
        prefetch_step_ahead_of(dy, i, dt);
        if (go) prefetch_step_ahead_of(go, i, dt);
        vf x0 = vf_ld(x, i, dt), x1 = vf_ld(x, i + VF_LANES, dt);
        vf s0 = hs ? vf_ld(side, i, dt) : z, s1 = hs ? vf_ld(side, i + VF_LANES, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        vf g1 = fused_g_ps(vf_ld(dy, i + VF_LANES, dt), x1, s1, q + 4, kind, hs, al);
        st_g(go, i, g0, dt);
        st_g(go, i + VF_LANES, g1, dt);
        gstats_step(&a, g0, centered_ps(x0, q[0], q[1]));
        gstats_step(&b, g1, centered_ps(x1, q[4], q[5]));
    }
    int odd = 0;
    if (i + VF_LANES <= n) {
        vf x0 = vf_ld(x, i, dt), s0 = hs ? vf_ld(side, i, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        st_g(go, i, g0, dt);
        gstats_step(&a, g0, centered_ps(x0, q[0], q[1]));
        i += VF_LANES;
        odd = 1;
    }
    if (i < n) {
        const vf *r = q + 4 * odd;
        int64_t cnt = n - i;
        vf_mask mk = vf_mask_first(cnt);
        vf x0 = vf_ld_part(x, i, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, i, cnt, cnt, dt) : z;
        /* dead lanes: g and d are masked to 0, whatever the activation of
         * a zero pre-activation gives */
        vf g = vf_keep(fused_g_ps(vf_ld_part(dy, i, cnt, cnt, dt), x0, s0, r, kind, hs, al), mk);
        vf d = vf_keep(centered_ps(x0, r[0], r[1]), mk);
        st_g_part(go, i, g, cnt, dt);
        gstats_step(odd ? &b : &a, g, d);
    }
    *ea = a;
    *oa = b;
}

INLINE void accf_add_to(const accf *a, double *s1, double *s2)
{
    accf c = accf_load(s1, s2);
    c.s1lo = vd_add(c.s1lo, a->s1lo);
    c.s1hi = vd_add(c.s1hi, a->s1hi);
    c.s2lo = vd_add(c.s2lo, a->s2lo);
    c.s2hi = vd_add(c.s2hi, a->s2hi);
    accf_store(&c, s1, s2);
}

/* rows of a width that 2 VF_LANES does not divide: blocks of FUSED_ROWS
 * rows keep each VF_LANES-column group's sums in registers, added to acc
 * (2 w doubles, in L1) once per block */
INLINE void fgstats_rows_w_ps(const void *dy, const void *x, const void *side, int64_t rows, int64_t w,
                              const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt, double *acc)
{
    const float *const v[7] = FGRAD_ARRAYS(p);
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full, n = rows * w;
    const size_t es = dt ? 2 : 4;
    const vf z = vf_zero();
    const vf_mask mk = vf_mask_first(cnt);
    void *go = p->g_out;
    vf t[4];
    tail_params_ps(v, 4, full, cnt, t);
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    accf ta = accf_zero();
    int64_t r = 0;
    while (r < rows) {
        const int64_t kr = rows - r < FUSED_ROWS ? rows - r : FUSED_ROWS, o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES) {
            vf q[4];
            col_params_ps(v, 4, j, q);
            if (kr == FUSED_ROWS) {
                prefetch_group_l2(dy, o, j, es);
                prefetch_group_l2(x, o, j, es);
                if (go) prefetch_group_l2(go, o, j, es);
            }
            accf c = accf_zero();
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + j;
                vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : z;
                vf g = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
                st_g(go, e, g, dt);
                gstats_step(&c, g, centered_ps(x0, q[0], q[1]));
            }
            accf_add_to(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + full, av = n - e;
                vf x0 = vf_ld_part(x, e, cnt, av, dt), s0 = hs ? vf_ld_part(side, e, cnt, av, dt) : z;
                vf g = vf_keep(fused_g_ps(vf_ld_part(dy, e, cnt, av, dt), x0, s0, t, kind, hs, al), mk);
                st_g_part(go, e, g, cnt, dt);
                gstats_step(&ta, g, vf_keep(centered_ps(x0, t[0], t[1]), mk));
            }
        }
        r += kr;
    }
    if (cnt) accf_store_part(&ta, acc + full, acc + w + full, cnt);
}

/* Fused gradient sums in float blocks, as the plain kernels sum (8 rows, or
 * stretches of 8 vector pairs of a run, pairwise in float, then added in
 * double):
 * the double accumulation above converts every g and d, which costs more
 * than the pass's loads.  A column (or run) whose float sums need double
 * (needs_double) is summed again one element at a time, g recomputed with
 * bn_math.h's formulas. */
COLD void fgstats_column_pd(const void *dy, const void *x, int64_t rows, int64_t w, int64_t j,
                            const cfbn_grad_f32 *p, int64_t c, double *s1, double *s2, int dt)
{
    const void *side = p->side;
    float mhi = p->mhi[c], mlo = p->mlo[c], ya = p->ya[c], yb = p->yb[c];
    double a = 0.0, b = 0.0;
    /* A NaN g makes both sums NaN for good, so the loop stops there; a NaN
     * g d alone does not: g is 0 where an infinite x meets a zero act',
     * and sum g stays finite past it. */
    for (int64_t r = 0; r < rows && a == a; r++) {
        int64_t i = r * w + j;
        float xv = ld1(x, i, dt), sv = side ? ld1(side, i, dt) : 0.0f;
        float g = cfbn_fused_g_f(p->act, p->act_alpha, ld1(dy, i, dt), xv, side != NULL, sv, mhi, mlo, ya, yb);
        float d = (xv - mhi) - mlo;
        a += (double)g;
        b += (double)g * (double)d;
    }
    *s1 = a;
    *s2 = b;
}

INLINE void fgstats_redo_columns(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                 double *acc, int dt)
{
    for (int64_t j = 0; j < w; j++) {
        int redo = needs_double(acc[j], acc[w + j], (double)rows, fabs(p->mhi[j]),
                                finite_f(p->mhi[j]) && finite_f(p->mlo[j]));
        if (redo) fgstats_column_pd(dy, x, rows, w, j, p, j, acc + j, acc + w + j, dt);
    }
}

/* rows of a multiple of VF_LANES wider than 2 VF_LANES (gstats_rows8_ps with
 * g for dy): blocks of FUSED_ROWS rows, summed a pair of rows at a time */
INLINE void fgstats_rows8_ps(const void *dy, const void *x, const void *side, int64_t rows, int64_t w,
                             const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt, double *acc)
{
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    const size_t es = dt ? 2 : 4, rs = (size_t)w * es;
    const vf z = vf_zero();
    void *go = p->g_out;
    int64_t r = 0;
    for (; r + FUSED_ROWS <= rows; r += FUSED_ROWS) {
        const int64_t o = r * w;
        const size_t cs = VF_LANES * es;
        const char *bd = (const char *)dy + (size_t)o * es, *bx = (const char *)x + (size_t)o * es;
        const char *bs = hs ? (const char *)side + (size_t)o * es : NULL;
        for (int64_t j = 0; j < w; j += VF_LANES, bd += cs, bx += cs, bs = hs ? bs + cs : NULL) {
            prefetch_group_l2(dy, o, j, es);
            prefetch_group_l2(x, o, j, es);
            if (hs) prefetch_group_l2(side, o, j, es);
            if (go) prefetch_group_l2(go, o, j, es);
            const vf q[4] = {vf_load(p->mhi + j), vf_load(p->mlo + j),
                                 vf_load(p->ya + j), vf_load(p->yb + j)};
            vf sg[FUSED_ROWS / 2], sq[FUSED_ROWS / 2];
            for (int k = 0; k < FUSED_ROWS / 2; k++) {
                vf x0 = vf_ld(bx + 2 * k * rs, 0, dt), x1 = vf_ld(bx + (2 * k + 1) * rs, 0, dt);
                vf s0 = hs ? vf_ld(bs + 2 * k * rs, 0, dt) : z, s1 = hs ? vf_ld(bs + (2 * k + 1) * rs, 0, dt) : z;
                vf g0 = fused_g_ps(vf_ld(bd + 2 * k * rs, 0, dt), x0, s0, q, kind, hs, al);
                vf g1 = fused_g_ps(vf_ld(bd + (2 * k + 1) * rs, 0, dt), x1, s1, q, kind, hs, al);
                st_g(go, o + 2 * k * w + j, g0, dt);
                st_g(go, o + (2 * k + 1) * w + j, g1, dt);
                vf u0 = vf_sub(x0, q[0]), u1 = vf_sub(x1, q[0]);
                sg[k] = vf_add(g0, g1);
                sq[k] = vf_fma(g1, u1, vf_mul(g0, u0));
            }
            vf t1 = vf_add(vf_add(sg[0], sg[1]), vf_add(sg[2], sg[3]));
            vf t2 = vf_add(vf_add(sq[0], sq[1]), vf_add(sq[2], sq[3]));
            add_block_mlo(acc, w, j, t1, t2, q[1]);
        }
    }
    for (; r < rows; r++) {
        for (int64_t j = 0; j < w; j += VF_LANES) {
            const vf q[4] = {vf_load(p->mhi + j), vf_load(p->mlo + j),
                                 vf_load(p->ya + j), vf_load(p->yb + j)};
            vf x0 = vf_ld(x, r * w + j, dt), s0 = hs ? vf_ld(side, r * w + j, dt) : z;
            vf g = fused_g_ps(vf_ld(dy, r * w + j, dt), x0, s0, q, kind, hs, al);
            st_g(go, r * w + j, g, dt);
            add_block(acc, w, j, g, vf_mul(g, centered_ps(x0, q[0], q[1])));
        }
    }
    if (any_suspect(acc, w, (double)rows)) fgstats_redo_columns(dy, x, rows, w, p, acc, dt);
}

/* a run: stretches of TREE_VECS vector pairs (even and odd blocks, as
 * gstats_flat_ps's tree) summed pairwise in float, the rest by
 * fgstats_flat_ps's double steps */
#define FTREE_STRETCH (2 * TREE_VECS * VF_LANES)

/* A fused tree block: TREE_VECS vectors from e, step elements apart, g
 * formed (and stored where go is given) and summed with x - mhi into a.
 * Unrolled without an activation or with one whose derivative is a
 * comparison: GCC left some of these small loops rolled, spilling, and the
 * unrolled run sums of relu, relu6 and leaky relu take 0.86-0.92 of the time
 * (benchmarks/table_ab.sh).  Unrolled too, the exp family's (whose arithmetic
 * outweighs the spills) made bn_avx2.c take 1.6x as long to compile. */
INLINE void fgstats_vec(tree_acc *t, int k, const void *dy, const void *x, const void *side, void *go, int64_t e,
                        const vf *q, int kind, int hs, vf al, int dt)
{
    vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : vf_zero();
    vf g = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
    st_g(go, e, g, dt);
    tree_push(t, k, g, vf_sub(x0, q[0]));
}

INLINE void fgstats_block(accf *a, const void *dy, const void *x, const void *side, void *go, int64_t e,
                          int64_t step, const vf *q, int kind, int hs, vf al, int dt)
{
    tree_acc t = tree_start();
    if (kind == CFBN_ACT_NONE || cfbn_act_grad_is_compare(kind)) {
#pragma GCC unroll 8
        for (int k = 0; k < TREE_VECS; k++) fgstats_vec(&t, k, dy, x, side, go, e + k * step, q, kind, hs, al, dt);
    } else {
        for (int k = 0; k < TREE_VECS; k++) fgstats_vec(&t, k, dy, x, side, go, e + k * step, q, kind, hs, al, dt);
    }
    gstats_tree_add(a, t.s[1], t.p[1], q[1]);
}

INLINE void fgstats_tree_vec(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                             int kind, int hs, vf al, int dt, vd *v1, vd *v2)
{
    accf a = accf_zero(), b = accf_zero(), e, o;
    int64_t i = 0;
    for (; i + FTREE_STRETCH <= n; i += FTREE_STRETCH) {
        for (int k = 0; k < TREE_VECS; k++) {
            prefetch_step_ahead_of(x, i + 2 * VF_LANES * k, dt);
            prefetch_step_ahead_of(dy, i + 2 * VF_LANES * k, dt);
            if (hs) prefetch_step_ahead_of(side, i + 2 * VF_LANES * k, dt);
            if (go) prefetch_step_ahead_of(go, i + 2 * VF_LANES * k, dt);
        }
        fgstats_block(&a, dy, x, side, go, i, 2 * VF_LANES, q, kind, hs, al, dt);
        fgstats_block(&b, dy, x, side, go, i + VF_LANES, 2 * VF_LANES, q, kind, hs, al, dt);
    }
    fgstats_flat_ps(elem_at(dy, i, dt), elem_at(x, i, dt), hs ? elem_at(side, i, dt) : NULL,
                    go ? (void *)elem_at(go, i, dt) : NULL, n - i, q, kind, hs, al, dt, &e, &o);
    *v1 = vd_add(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)),
                        vd_add(vd_add(e.s1lo, e.s1hi), vd_add(o.s1lo, o.s1hi)));
    *v2 = vd_add(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)),
                        vd_add(vd_add(e.s2lo, e.s2hi), vd_add(o.s2lo, o.s2hi)));
}

INLINE void fgstats_tree_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                            int kind, int hs, vf al, int dt, double *acc)
{
    vd v1, v2;
    fgstats_tree_vec(dy, x, side, go, n, q, kind, hs, al, dt, &v1, &v2);
    acc[0] = vd_hsum(v1);
    acc[1] = vd_hsum(v2);
}

INLINE void fgstats_run_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    run_params_ps((const float *const[7])FGRAD_ARRAYS(p), 4, q);
    const void *side = p->side;
#define FGSTATS_RUN(k) fgstats_tree_ps(dy, x, side, p->g_out, n, q, k, side != NULL, al, dt, acc)
    FUSED_SPECIALIZE(p->act, side, FGSTATS_RUN)
#undef FGSTATS_RUN
    if (n >= FTREE_STRETCH && run_needs_double(acc, n, p)) fgstats_column_pd(dy, x, n, 1, 0, p, 0, acc, acc + 1, dt);
}

INLINE void fgstats_rows_ps(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                            double *acc, int dt)
{
    if (w <= 0) return;
    const void *side = p->side;
    const vf al = vf_set1(p->act_alpha);
    if (w % VF_LANES == 0 && w > 2 * VF_LANES) {
#define FGSTATS_ROWS8(k) fgstats_rows8_ps(dy, x, side, rows, w, p, k, side != NULL, al, dt, acc)
        FUSED_SPECIALIZE(p->act, side, FGSTATS_ROWS8)
#undef FGSTATS_ROWS8
        return;
    }
    if ((2 * VF_LANES) % w == 0) {
        const float *const v[7] = FGRAD_ARRAYS(p);
        vf q[8];
        lanes_params_ps(v, 4, w, q);
        /* zero for a code outside enum cfbn_activation, which reaches no
         * call below (and -Wmaybe-uninitialized sees that path) */
        accf e = accf_zero(), o = accf_zero();
#define FGSTATS_FLAT(k) fgstats_flat_ps(dy, x, side, p->g_out, rows * w, q, k, side != NULL, al, dt, &e, &o)
        FUSED_SPECIALIZE(p->act, side, FGSTATS_FLAT)
#undef FGSTATS_FLAT
        fold_accf(&e, &o, w, acc);
        return;
    }
#define FGSTATS_ROWS(k) fgstats_rows_w_ps(dy, x, side, rows, w, p, k, side != NULL, al, dt, acc)
    FUSED_SPECIALIZE(p->act, side, FGSTATS_ROWS)
#undef FGSTATS_ROWS
}

/* ---- gradient apply: dx = g a + ((x - mhi) - mlo) b + c, side_grad = g ---- */

INLINE void fgapply_rows_w_ps(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t rows,
                              int64_t w, const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt)
{
    const float *const v[7] = FGRAD_ARRAYS(p);
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full, n = rows * w;
    const vf z = vf_zero();
    vf t[7];
    tail_params_ps(v, 7, full, cnt, t);
    /* blocks of FUSED_ROWS rows, each VF_LANES-column group's 7 parameters
     * loaded once per block (loaded per row, they outnumber the data
     * loads).  A block's loads come from FUSED_ROWS rows at once, which the
     * hardware prefetchers follow poorly from DRAM: each column group
     * prefetches its share of the inputs ahead, as gstats_rows8_ps does
     * (measured on 25088 rows of 128, relu, one thread: 1.00 -> 0.40 ns an
     * element, the plain gapply_rows 0.38).  Regular stores only
     * (fgapply_nt). */
    const size_t es = dt ? 2 : 4;
    for (int64_t r = 0; r < rows; r += FUSED_ROWS) {
        const int64_t kr = rows - r < FUSED_ROWS ? rows - r : FUSED_ROWS, o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES) {
            if (kr == FUSED_ROWS) {
                prefetch_group_l2(dy, o, j, es);
                prefetch_group_l2(x, o, j, es);
                if (hs) prefetch_group_l2(side, o, j, es);
                prefetch_group_l2(dx, o, j, es);
            }
            vf q[7];
            col_params_ps(v, 7, j, q);
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + j;
                vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : z;
                vf g0 = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
                if (sg) vf_st(sg, e, g0, dt);
                vf_st(dx, e, gapply_ps(g0, x0, q[0], q[1], q[4], q[5], q[6]), dt);
            }
        }
        for (int64_t k = 0; cnt && k < kr; k++) {
            const int64_t e = o + k * w + full;
            fout_part(1, dy, x, side, dx, sg, e, cnt, n - e, t, kind, hs, al, dt);
        }
    }
}

/* Streaming for the fused gradient's elementwise pass (fused_nt's, and
 * more): only a flat stream (rows: flat only when 2 VF_LANES is a multiple
 * of their width) with one output and a derivative that is a compare.
 * With the side input's gradient as a second streamed output, or the exp
 * family's arithmetic, or the rows of other widths, streaming was slower
 * than regular stores: (32,56,56,64) float32 NHWC, one thread, Zen 3,
 * regular against streaming stores, ms: relu 5.2 / 6.5, relu with side
 * input and its gradient 8.3 / 18.4, silu 6.8 / 10.7; a run of the same
 * size, relu 3.6 / 3.2, relu with side and gradient 5.0 / 4.4 but 5.9 /
 * 6.8 as rows of 16, silu with side and gradient 7.6 / 12.4. */
INLINE int fgapply_nt(const cfbn_grad_f32 *p, int dt, const void *dx, int64_t w)
{
    return cfbn_act_grad_is_compare(p->act) && !p->side_grad && (2 * VF_LANES) % (w ? w : 1) == 0 && fused_nt(p->stream, dt, dx, dx, w);
}

INLINE void fgapply_run_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const int nt = fgapply_nt(p, dt, dx, 0);
    const vf al = vf_set1(p->act_alpha);
    vf q[14];
    run_params_ps((const float *const[7])FGRAD_ARRAYS(p), 7, q);
    const void *side = p->side;
    void *sg = p->side_grad;
#define FGAPPLY_RUN(k) fout_flat_ps(1, dy, x, side, dx, sg, n, q, k, side != NULL, al, dt, nt)
    FUSED_SPECIALIZE(p->act, side, FGAPPLY_RUN)
#undef FGAPPLY_RUN
    if (nt) stream_fence();
}

INLINE void fgapply_rows_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                            int dt)
{
    const int nt = fgapply_nt(p, dt, dx, w);
    if (w <= 0) return;
    const void *side = p->side;
    void *sg = p->side_grad;
    const vf al = vf_set1(p->act_alpha);
    if ((2 * VF_LANES) % w == 0) {
        const float *const v[7] = FGRAD_ARRAYS(p);
        vf q[14];
        lanes_params_ps(v, 7, w, q);
#define FGAPPLY_FLAT(k) fout_flat_ps(1, dy, x, side, dx, sg, rows * w, q, k, side != NULL, al, dt, nt)
        FUSED_SPECIALIZE(p->act, side, FGAPPLY_FLAT)
#undef FGAPPLY_FLAT
        if (nt) stream_fence();
        return;
    }
#define FGAPPLY_ROWS(k) fgapply_rows_w_ps(dy, x, side, dx, sg, rows, w, p, k, side != NULL, al, dt)
    FUSED_SPECIALIZE(p->act, side, FGAPPLY_ROWS)
#undef FGAPPLY_ROWS
}

/* Several runs of one channel (cfbn.h: runs, stride) in one call, without the
 * fused or streaming variants: parameters broadcast once, and the gradient
 * sums stay in vector registers across runs, added up once at the end.
 * Each run first prefetches the next channel's (bn_runs.h). */

INLINE void out_runs_ps(int grad, const void *dy, const void *x, void *y, int64_t n, int64_t runs, int64_t st,
                        const float *const *v, int dt)
{
    vf q[10];
    run_params_ps(v, NPAR(grad), q);
    for (int64_t k = 0; k < runs; k++) {
        if (grad) prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (k + 1 < runs) prefetch_run_out(elem_at(y, (k + 1) * st, dt), n * (dt ? 2 : 4));
        out_uni_ps(grad, grad ? elem_at(dy, k * st, dt) : NULL, elem_at(x, k * st, dt),
                   (void *)elem_at(y, k * st, dt), n, q, dt);
    }
}

INLINE void apply_runs_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    out_runs_ps(0, NULL, x, y, n, p->runs, p->stride, v, dt);
}

/* Short runs (up to SHORT_RUN elements, such as 7x7 planes) go TREE_VECS
 * (8) runs at a time: the 8 runs' vectors at each position are summed
 * pairwise in float, like 8 rows of the rows kernels, and widened once,
 * which halves the work per element against one run after another.  Not
 * when the stride is a multiple of 4 KB: the 8 runs' lines of both tensors
 * would then share one L1 set, more than its 8 ways. */
#define SHORT_RUN 256

/* The first runs of a call taken TREE_VECS at a time while that many
 * remain, for short runs
 * (see above): their sums added to s1, s2; returns the number of runs done.
 * g = fused_g_ps(dy, ...) (dy itself with CFBN_ACT_NONE), q its parameters
 * (mhi, mlo, ya, yb).  Dead lanes of a run's tail: g masked to 0, d = 0 - 0. */
INLINE int64_t gstats_runs8_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, int64_t runs,
                               int64_t st, const vf *q, int kind, int hs, vf al, int dt, vd *s1,
                               vd *s2)
{
    const vf z = vf_zero();
    const int64_t full = n & ~(int64_t)(VF_LANES - 1), cnt = n - full;
    const vf_mask mk = vf_mask_first(cnt);
    const vf tm = vf_keep(q[0], mk), tl = vf_keep(q[1], mk);
    int64_t k = 0;
    for (; k + TREE_VECS <= runs; k += TREE_VECS) {
        accf a = accf_zero();
        for (int64_t i = 0; i < full; i += VF_LANES)
            fgstats_block(&a, dy, x, side, go, k * st + i, st, q, kind, hs, al, dt);
        if (cnt) {
            tree_acc t = tree_start();
            for (int r = 0; r < TREE_VECS; r++) {
                const int64_t e = (k + r) * st + full;
                vf x0 = vf_ld_part(x, e, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, e, cnt, cnt, dt) : z;
                vf g = vf_keep(fused_g_ps(vf_ld_part(dy, e, cnt, cnt, dt), x0, s0, q, kind, hs, al), mk);
                st_g_part(go, e, g, cnt, dt);
                tree_push(&t, r, g, vf_sub(x0, tm));
            }
            gstats_tree_add(&a, t.s[1], t.p[1], tl);
        }
        *s1 = vd_add(*s1, vd_add(a.s1lo, a.s1hi));
        *s2 = vd_add(*s2, vd_add(a.s2lo, a.s2hi));
    }
    return k;
}

INLINE void gstats_runs_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    const vf q[4] = {m, l, m, l};
    vd s1 = vd_zero(), s2 = vd_zero();
    const int64_t st = p->stride;
    int64_t k = 0;
    if (n <= SHORT_RUN && (st * (dt ? 2 : 4)) % 4096 != 0)
        k = gstats_runs8_ps(dy, x, NULL, NULL, n, p->runs, st, q, CFBN_ACT_NONE, 0, vf_zero(), dt, &s1,
                            &s2);
    for (; k < p->runs; k++) {
        accf a, b;
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        gstats_flat_ps(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), n, q, dt, 1, &a, &b);
        s1 = vd_add(s1, vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
        s2 = vd_add(s2, vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
    }
    acc[0] = vd_hsum(s1);
    acc[1] = vd_hsum(s2);
    /* one channel's runs: checked once, on the totals (the losses bound by
     * needs_double add up over the runs as the sums do) */
    if (run_needs_double(acc, n * p->runs, p)) gstats_runs_pd(dy, x, n, p->runs, st, p, acc, dt);
}

/* Statistics of one channel's runs.  Short runs go TREE_VECS at a time as
 * gstats_runs8_ps's: d = x - k, k the shift rounded to float, the runs'
 * vectors at each position summed pairwise in float and widened once; the
 * runs left over and the rounding of k (as in stats_run_ps), checked once
 * on the totals.  Long runs go one by one through stats_run_ps. */
/* Adds the sums of runs [r0, runs) to s, one run at a time: by stats_run_ps,
 * or with pd by stats_run_pd (every element in double) */
INLINE void stats_each_run(const void *x, int64_t n, int64_t r0, int64_t runs, int64_t st, double shift, int pd,
                           double *s, int dt)
{
    for (int64_t r = r0; r < runs; r++) {
        double one[2];
        prefetch_next_run(elem_at(x, r * st, dt), n * (dt ? 2 : 4));
        if (pd) stats_run_pd(elem_at(x, r * st, dt), n, shift, one, dt);
        else stats_run_ps(elem_at(x, r * st, dt), n, shift, one, dt);
        s[0] += one[0];
        s[1] += one[1];
    }
}

INLINE void stats_runs_ps(const void *x, int64_t n, int64_t runs, int64_t st, double shift, double *acc, int dt)
{
    acc[0] = acc[1] = 0.0;
    if (n > SHORT_RUN || (st * (dt ? 2 : 4)) % 4096 == 0 || runs < TREE_VECS) {
        stats_each_run(x, n, 0, runs, st, shift, 0, acc, dt);
        return;
    }
    const float kf = (float)shift;
    const vf k = vf_set1(kf);
    const int64_t full = n & ~(int64_t)(VF_LANES - 1), cnt = n - full;
    /* dead lanes of a run shorter than VF_LANES: x reads as 0 and k is
     * masked to 0 */
    const vf tk = vf_keep(k, vf_mask_first(cnt));
    const vf_mask last = vf_mask_last(cnt);
    accf a = accf_zero();
    int64_t r = 0;
    for (; r + TREE_VECS <= runs; r += TREE_VECS) {
        vf d[TREE_VECS];
        for (int64_t i = 0; i < full; i += VF_LANES) {
            for (int j = 0; j < TREE_VECS; j++) d[j] = sub_ps(vf_ld(x, (r + j) * st + i, dt), k);
            stats_block_add(&a, d);
        }
        if (cnt && full) {
            /* the run's last VF_LANES elements, the lanes already summed
             * masked off */
            for (int j = 0; j < TREE_VECS; j++)
                d[j] = vf_keep(vf_sub(vf_ld(x, (r + j) * st + n - VF_LANES, dt), k), last);
            stats_block_add(&a, d);
        } else if (cnt) {
            for (int j = 0; j < TREE_VECS; j++) d[j] = vf_sub(vf_ld_part(x, (r + j) * st, cnt, cnt, dt), tk);
            stats_block_add(&a, d);
        }
    }
    double s[2] = {vd_hsum(vd_add(a.s1lo, a.s1hi)), vd_hsum(vd_add(a.s2lo, a.s2hi))};
    stats_each_run(x, n, r, runs, st, (double)kf, 1, s, dt);
    const double count = (double)n * (double)runs, e = (double)kf - shift, ne = count * e;
    acc[0] = s[0] + ne;
    acc[1] = s[1] + e * (2.0 * s[0] + ne);
    if (needs_double(acc[0], acc[1], count, -1.0, 1)) {
        acc[0] = acc[1] = 0.0;
        stats_each_run(x, n, 0, runs, st, shift, 1, acc, dt);
    }
}

INLINE void gapply_runs_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const float *const v[5] = GRAD_ARRAYS(p);
    out_runs_ps(1, dy, x, dx, n, p->runs, p->stride, v, dt);
}

/* Fused runs (cfbn.h: *_runs_fused): as the plain runs kernels, with the
 * activation chosen and the parameters broadcast once per call rather than
 * once per run, and regular stores.  The gradient sums of short runs go
 * TREE_VECS runs at a time as gstats_runs_ps's, longer ones run by run as
 * fgstats_tree_ps sums, all added up in vector registers.  Unlike the plain
 * sums, 8 at a time also at strides of a multiple of 4 KB: the activation's
 * arithmetic hides the L1 set conflicts there.  Measured on (32,256,14,14)
 * NCHW (strides of 49 pages), relu gradient over the plain one, one thread:
 * 1.32 run by run, 1.18 8 runs at a time. */
INLINE void fapply_runs_k(const void *x, const void *side, void *y, int64_t n, int64_t runs, int64_t st,
                          const vf *q, int kind, int hs, vf al, int dt)
{
    for (int64_t k = 0; k < runs; k++) {
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        if (k + 1 < runs) prefetch_run_out(elem_at(y, (k + 1) * st, dt), n * (dt ? 2 : 4));
        fout_flat_ps(0, NULL, elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                     (void *)elem_at(y, k * st, dt), NULL, n, q, kind, hs, al, dt, 0);
    }
}

INLINE void fapply_runs_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    run_params_ps((const float *const[4])APPLY_ARRAYS(p), 4, q);
    const void *side = p->side;
#define FAPPLY_RUNS(k) fapply_runs_k(x, side, y, n, p->runs, p->stride, q, k, side != NULL, al, dt)
    FUSED_SPECIALIZE(p->act, side, FAPPLY_RUNS)
#undef FAPPLY_RUNS
}

/* The fused gradient sums of runs, every product and sum in double (for
 * sums whose float blocks left float's range, needs_double) */
COLD void fgstats_runs_pd(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    cfbn_grad_f32 q = *p;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t k = 0; k < p->runs; k++) {
        double a, b;
        q.side = p->side ? elem_at(p->side, k * p->stride, dt) : NULL;
        fgstats_column_pd(elem_at(dy, k * p->stride, dt), elem_at(x, k * p->stride, dt), n, 1, 0, &q, 0, &a, &b,
                          dt);
        s1 += a;
        s2 += b;
    }
    acc[0] = s1;
    acc[1] = s2;
}

INLINE void fgstats_runs_k(const void *dy, const void *x, const void *side, void *go, int64_t n, int64_t runs,
                           int64_t st, const vf *q, int kind, int hs, vf al, int dt, double *acc)
{
    vd s1 = vd_zero(), s2 = vd_zero();
    int64_t k = 0;
    if (n <= SHORT_RUN) k = gstats_runs8_ps(dy, x, side, go, n, runs, st, q, kind, hs, al, dt, &s1, &s2);
    for (; k < runs; k++) {
        vd v1, v2;
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        fgstats_tree_vec(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                         go ? (void *)elem_at(go, k * st, dt) : NULL, n, q, kind, hs, al, dt, &v1, &v2);
        s1 = vd_add(s1, v1);
        s2 = vd_add(s2, v2);
    }
    acc[0] = vd_hsum(s1);
    acc[1] = vd_hsum(s2);
}

INLINE void fgstats_runs_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    run_params_ps((const float *const[7])FGRAD_ARRAYS(p), 4, q);
    const void *side = p->side;
#define FGSTATS_RUNS(k) fgstats_runs_k(dy, x, side, p->g_out, n, p->runs, p->stride, q, k, side != NULL, al, dt, acc)
    FUSED_SPECIALIZE(p->act, side, FGSTATS_RUNS)
#undef FGSTATS_RUNS
    /* checked once, on the totals, as gstats_runs_ps does */
    if (run_needs_double(acc, n * p->runs, p)) fgstats_runs_pd(dy, x, n, p, acc, dt);
}

INLINE void fgapply_runs_k(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t n,
                           int64_t runs, int64_t st, const vf *q, int kind, int hs, vf al, int dt)
{
    for (int64_t k = 0; k < runs; k++) {
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        if (k + 1 < runs) {
            prefetch_run_out(elem_at(dx, (k + 1) * st, dt), n * (dt ? 2 : 4));
            if (sg) prefetch_run_out(elem_at(sg, (k + 1) * st, dt), n * (dt ? 2 : 4));
        }
        fout_flat_ps(1, elem_at(dy, k * st, dt), elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                     (void *)elem_at(dx, k * st, dt), sg ? (void *)elem_at(sg, k * st, dt) : NULL, n, q, kind, hs,
                     al, dt, 0);
    }
}

INLINE void fgapply_runs_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[14];
    run_params_ps((const float *const[7])FGRAD_ARRAYS(p), 7, q);
    const void *side = p->side;
    void *sg = p->side_grad;
#define FGAPPLY_RUNS(k) fgapply_runs_k(dy, x, side, dx, sg, n, p->runs, p->stride, q, k, side != NULL, al, dt)
    FUSED_SPECIALIZE(p->act, side, FGAPPLY_RUNS)
#undef FGAPPLY_RUNS
}
