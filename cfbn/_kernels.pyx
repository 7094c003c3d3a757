# cython: language_level=3
"""Thin wrapper over the C driver: pointers in, GIL released, nothing else.

Arguments arrive already validated by cfbn._args (dtype, shape, contiguity);
this layer only takes data pointers and calls the kernels with the GIL
released.  The kernel table is chosen once, when this module is imported.
"""
import os

import numpy as np

cimport numpy as cnp
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t
from libc.string cimport strncpy

cnp.import_array()

cdef extern from "cfbn.h":
    ctypedef struct cfbn_kernels:
        const char *name
    ctypedef struct cfbn_shape:
        int dtype
        int layout
        int64_t outer
        int64_t channels
        int64_t inner
        int n_threads
    ctypedef struct cfbn_fusion:
        int act
        double alpha
        const void *side
        const void *offset
        void *side_grad
    int CFBN_ISA_COUNT
    int CFBN_ACT_COUNT
    const char *cfbn_act_name(int act)
    const char *cfbn_isa_name(int isa)
    int cfbn_isa_compiled(int isa)
    int cfbn_isa_supported(int isa)
    int cfbn_isa_best()
    const cfbn_kernels *cfbn_isa_table(int isa)
    int CFBN_FAMILY_COUNT
    const cfbn_kernels *cfbn_default_table()
    const char *cfbn_cpu_row()
    const char *cfbn_family_name(int family)
    const cfbn_kernels *cfbn_family_table(const cfbn_kernels *k, int family)
    int64_t cfbn_cpu_l2_bytes()
    int cfbn_forward_training(const cfbn_kernels *k, const cfbn_shape *s,
                              const void *x, const void *scale, const void *offset,
                              const void *mean, const void *variance,
                              double epsilon, double factor,
                              void *y, void *batch_mean, void *batch_variance,
                              void *saved_mean, void *saved_variance,
                              const cfbn_fusion *fusion) nogil
    int cfbn_forward_inference(const cfbn_kernels *k, const cfbn_shape *s,
                               const void *x, const void *scale, const void *offset,
                               const void *mean, const void *variance, double epsilon,
                               void *y, void *batch_mean, void *batch_variance,
                               void *saved_mean, void *saved_variance,
                               const cfbn_fusion *fusion) nogil
    int cfbn_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                      const void *dy, const void *x, const void *scale,
                      const void *saved_mean, const void *saved_variance, double epsilon,
                      void *dx, void *scale_backprop, void *offset_backprop,
                      const cfbn_fusion *fusion) nogil
    int cfbn_backward_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                               const void *dy, const void *x, const void *scale,
                               const void *saved_mean, const void *saved_variance, double epsilon,
                               const void *ggx, const void *ggscale, const void *ggoffset,
                               void *ddy, void *dx, void *scale_backprop) nogil
    int cfbn_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *x,
                        double *mean, double *m2) nogil
    void cfbn_train_statistics(int64_t channels, int64_t count, const double *mean,
                               const double *m2, double factor, const double *running_mean,
                               const double *running_variance, double *variance,
                               double *batch_mean, double *batch_variance) nogil
    int cfbn_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *x, const void *scale,
                   const void *offset, const double *mean, const double *variance, double epsilon,
                   void *y) nogil
    int cfbn_grad_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *dy,
                             const void *x, const double *mean, const double *variance,
                             double epsilon, double *sum_dy, double *sum_dy_xhat) nogil
    int cfbn_grad_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                        const void *scale, const double *mean, const double *variance,
                        double epsilon, const double *sum_dy, const double *sum_dy_xhat,
                        double count, void *dx) nogil
    void cfbn_c_api_select(const cfbn_kernels *k)
    const void *cfbn_c_api_get()
    int cfbn_openmp_enabled()
    int cfbn_openmp_max_threads()
    int cfbn_threads_init()
    int cfbn_forked_child()
    void cfbn_set_trace(int on)
    int cfbn_trace_enabled()

cdef extern from "rules.h":
    double CFBN_EPSILON_LO, CFBN_EPSILON_HI, CFBN_FACTOR_LO, CFBN_FACTOR_HI
    double CFBN_FINITE_LO, CFBN_FINITE_HI
    long long CFBN_THREADS_LO, CFBN_THREADS_HI, CFBN_COUNT_LO, CFBN_COUNT_HI
    long long CFBN_ACTIVATION_LO, CFBN_ACTIVATION_HI
    const char *CFBN_EXPECT_EPSILON
    const char *CFBN_EXPECT_FACTOR
    const char *CFBN_EXPECT_FINITE
    const char *CFBN_EXPECT_THREADS
    const char *CFBN_EXPECT_COUNT
    const char *CFBN_EXPECT_ACTIVATION
    bint cfbn_epsilon_ok(double e)
    bint cfbn_factor_ok(double f)
    bint cfbn_finite_ok(double v)
    bint cfbn_threads_ok(long long n)

cdef extern from "bn_route.h":
    void cfbn_route_set_l2_bytes(int64_t l2)
    int64_t cfbn_route_channel_pass_min_bytes(int grad)

cdef extern from "out_cache.h":
    ctypedef struct cfbn_allocator:
        pass
    ctypedef struct cfbn_cache_stats:
        size_t limit
        size_t held_bytes
        int held_buffers
        unsigned long long hits
        unsigned long long misses
    size_t CFBN_CACHE_MIN_BYTES
    void cfbn_cache_init(const cfbn_allocator *raw, size_t limit)
    void cfbn_cache_allocator(cfbn_allocator *out)
    size_t cfbn_cache_set_limit(size_t limit)
    void cfbn_cache_release()
    void cfbn_cache_stats_get(cfbn_cache_stats *st)

# The memory-handler API (NEP 49, NumPy 1.22), declared here: the .pxd of
# NumPy 2.0.x, the newest NumPy for Python 3.9, does not declare it.  The C
# declarations need NPY_TARGET_VERSION >= 1.22 (setup.py sets it).
cdef extern from "numpy/arrayobject.h":
    PyObject *PyDataMem_DefaultHandler
    ctypedef struct mem_allocator "PyDataMemAllocator":
        pass
    ctypedef struct mem_handler "PyDataMem_Handler":
        char *name
        unsigned char version
        mem_allocator allocator
    object mem_set_handler "PyDataMem_SetHandler"(object handler)
    object mem_get_handler "PyDataMem_GetHandler"()

cdef const cfbn_kernels *_table = NULL
cdef int _isa = -1


def _isa_names():
    return [cfbn_isa_name(i).decode() for i in range(CFBN_ISA_COUNT)]


def compiled_isas():
    """Names of the ISA tables built into this extension."""
    return [cfbn_isa_name(i).decode() for i in range(CFBN_ISA_COUNT) if cfbn_isa_compiled(i)]


def supported_isas():
    """Names of the compiled ISA tables this CPU and OS can run."""
    return [cfbn_isa_name(i).decode() for i in range(CFBN_ISA_COUNT) if cfbn_isa_supported(i)]


def selected_isa():
    """Name of the active kernel table."""
    return cfbn_isa_name(_isa).decode()


def select_isa(name, source="isa"):
    """Make `name` the active kernel table for every family (for tests and
    CFBN_FORCE_ISA; not thread-safe)."""
    global _table, _isa
    names = _isa_names()
    if name not in names:
        raise ValueError("%s=%r is not a known ISA; expected one of %s"
                         % (source, name, ", ".join(names)))
    isa = names.index(name)
    if not cfbn_isa_compiled(isa):
        raise ValueError("%s=%r: this build of cfbn has no %s kernels (compiled: %s)"
                         % (source, name, name, ", ".join(compiled_isas())))
    if not cfbn_isa_supported(isa):
        raise ValueError("%s=%r: this CPU cannot run the %s kernels (supported: %s)"
                         % (source, name, name, ", ".join(supported_isas())))
    _table = cfbn_isa_table(isa)
    _isa = isa
    cfbn_c_api_select(_table)


def select_default():
    """Make the default table active: the best ISA's, with each loop family
    from the ISA measured fastest for it on this CPU where a CPU row of
    dispatch.c matches (`cpu_row`)."""
    global _table, _isa
    _table = cfbn_default_table()
    _isa = cfbn_isa_best()
    cfbn_c_api_select(_table)


def routes_families():
    """Whether the active table runs some families from another ISA."""
    return any(name != selected_isa() for name in family_isas().values())


def family_isas():
    """The ISA each loop family runs on under the active table."""
    return {cfbn_family_name(f).decode(): cfbn_family_table(_table, f).name.decode()
            for f in range(CFBN_FAMILY_COUNT)}


def cpu_row():
    """The name of the CPU row of dispatch.c that matches this CPU, or None."""
    cdef const char *name = cfbn_cpu_row()
    return None if name == NULL else name.decode()


def selection():
    """What `restore_selection` takes to make the active table active again."""
    return (selected_isa(), routes_families())


def restore_selection(selection):
    name, routed = selection
    if routed:
        select_default()
    else:
        select_isa(name)


def openmp_enabled():
    return bool(cfbn_openmp_enabled())


def max_threads():
    """Threads a call uses when n_threads is None (OpenMP's default, at most
    1024; 1 in a forked child)."""
    return cfbn_openmp_max_threads()


def forked_child():
    """Whether this process is the child of a fork() made after import: its
    calls then run on one thread (OpenMP's pool does not survive fork)."""
    return bool(cfbn_forked_child())


def l2_cache_bytes():
    """One core's L2 cache in bytes as the OS reports it (0: not reported)."""
    return cfbn_cpu_l2_bytes()


# The scalar rules of rules.h, for cfbn._args: rule -> (lowest value, highest
# value, the words of what it expects).
RULES = {
    "epsilon": (CFBN_EPSILON_LO, CFBN_EPSILON_HI, CFBN_EXPECT_EPSILON.decode()),
    "factor": (CFBN_FACTOR_LO, CFBN_FACTOR_HI, CFBN_EXPECT_FACTOR.decode()),
    "finite": (CFBN_FINITE_LO, CFBN_FINITE_HI, CFBN_EXPECT_FINITE.decode()),
    "threads": (CFBN_THREADS_LO, CFBN_THREADS_HI, CFBN_EXPECT_THREADS.decode()),
    "count": (CFBN_COUNT_LO, CFBN_COUNT_HI, CFBN_EXPECT_COUNT.decode()),
    "activation": (CFBN_ACTIVATION_LO, CFBN_ACTIVATION_HI, CFBN_EXPECT_ACTIVATION.decode()),
}


def _route_for_l2(l2_bytes):
    """Set the router's gradient channel-at-a-time floor as for a core with
    l2_bytes of L2 (what import does with l2_cache_bytes()); returns the
    floor in bytes.  For tests: both walks must give the same bits."""
    cfbn_route_set_l2_bytes(l2_bytes)
    return cfbn_route_channel_pass_min_bytes(1)


cfbn_route_set_l2_bytes(cfbn_cpu_l2_bytes())

if cfbn_threads_init() != 0:
    raise MemoryError("cfbn: could not register the fork handler")


cdef inline void *_ptr(object a):
    if a is None:
        return NULL
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline const cfbn_fusion *_set_fusion(cfbn_fusion *f, int act, double alpha, object side,
                                           object offset, object side_grad):
    f.act = act
    f.alpha = alpha
    f.side = _ptr(side)
    f.offset = _ptr(offset)
    f.side_grad = _ptr(side_grad)
    return f


cdef inline const cfbn_fusion *_fusion(cfbn_fusion *f, object fusion):
    """fusion = (activation code, alpha, side, offset, side_grad), or None."""
    if fusion is None:
        return NULL
    act, alpha, side, offset, side_grad = fusion
    return _set_fusion(f, act, alpha, side, offset, side_grad)


cdef inline int _shape(cfbn_shape *s, int dtype, int layout, int64_t outer, int64_t channels,
                       int64_t inner, int n_threads) except -1:
    # The C driver trusts these codes: an unknown one would be read with the
    # wrong element size.
    if not 0 <= dtype <= 3:
        raise ValueError("cfbn: unknown kernel dtype code %d" % dtype)
    if layout != 0 and layout != 1:
        raise ValueError("cfbn: unknown kernel layout code %d" % layout)
    s.dtype = dtype
    s.layout = layout
    s.outer = outer
    s.channels = channels
    s.inner = inner
    s.n_threads = n_threads if n_threads > 0 else cfbn_openmp_max_threads()
    return 0


cdef inline int _checked(int rc) except -1:
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")
    return 0


# The driver calls, shared by the functions cfbn._args calls after its
# checks and by the fast paths below, which call them without a Python call
# in between.

cdef int _forward_training(const cfbn_shape *s, x, scale, offset, mean, variance,
                           double epsilon, double factor, y, batch_mean, batch_variance,
                           saved_mean, saved_variance, const cfbn_fusion *fu) except -1:
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef void *poffset = _ptr(offset)
    cdef void *pmean = _ptr(mean)
    cdef void *pvar = _ptr(variance)
    cdef void *py = _ptr(y)
    cdef void *pbm = _ptr(batch_mean)
    cdef void *pbv = _ptr(batch_variance)
    cdef void *psm = _ptr(saved_mean)
    cdef void *psv = _ptr(saved_variance)
    cdef int rc
    with nogil:
        rc = cfbn_forward_training(_table, s, px, pscale, poffset, pmean, pvar, epsilon, factor,
                                   py, pbm, pbv, psm, psv, fu)
    return _checked(rc)


cdef int _forward_inference(const cfbn_shape *s, x, scale, offset, mean, variance,
                            double epsilon, y, batch_mean, batch_variance, saved_mean,
                            saved_variance, const cfbn_fusion *fu) except -1:
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef void *poffset = _ptr(offset)
    cdef void *pmean = _ptr(mean)
    cdef void *pvar = _ptr(variance)
    cdef void *py = _ptr(y)
    cdef void *pbm = _ptr(batch_mean)
    cdef void *pbv = _ptr(batch_variance)
    cdef void *psm = _ptr(saved_mean)
    cdef void *psv = _ptr(saved_variance)
    cdef int rc
    with nogil:
        rc = cfbn_forward_inference(_table, s, px, pscale, poffset, pmean, pvar, epsilon,
                                    py, pbm, pbv, psm, psv, fu)
    return _checked(rc)


cdef int _backward(const cfbn_shape *s, bint training, dy, x, scale, saved_mean,
                   saved_variance, double epsilon, dx, scale_backprop, offset_backprop,
                   const cfbn_fusion *fu) except -1:
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef void *psm = _ptr(saved_mean)
    cdef void *psv = _ptr(saved_variance)
    cdef void *pdx = _ptr(dx)
    cdef void *psb = _ptr(scale_backprop)
    cdef void *pob = _ptr(offset_backprop)
    cdef int rc
    with nogil:
        rc = cfbn_backward(_table, s, training, pdy, px, pscale, psm, psv, epsilon,
                           pdx, psb, pob, fu)
    return _checked(rc)


cdef int _backward_backward(const cfbn_shape *s, bint training, dy, x, scale, saved_mean,
                            saved_variance, double epsilon, ggx, ggscale, ggoffset, ddy, dx,
                            scale_backprop) except -1:
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef void *psm = _ptr(saved_mean)
    cdef void *psv = _ptr(saved_variance)
    cdef void *pq = _ptr(ggx)
    cdef void *pqs = _ptr(ggscale)
    cdef void *pqo = _ptr(ggoffset)
    cdef void *pddy = _ptr(ddy)
    cdef void *pdx = _ptr(dx)
    cdef void *psb = _ptr(scale_backprop)
    cdef int rc
    with nogil:
        rc = cfbn_backward_backward(_table, s, training, pdy, px, pscale, psm, psv, epsilon,
                                    pq, pqs, pqo, pddy, pdx, psb)
    return _checked(rc)


def forward_training(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                     int n_threads, x, scale, offset, mean, variance, double epsilon,
                     double factor, y, batch_mean, batch_variance, saved_mean, saved_variance,
                     fusion=None):
    cdef cfbn_shape s
    cdef cfbn_fusion fu
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    _forward_training(&s, x, scale, offset, mean, variance, epsilon, factor, y, batch_mean,
                      batch_variance, saved_mean, saved_variance, _fusion(&fu, fusion))


def forward_inference(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                      int n_threads, x, scale, offset, mean, variance, double epsilon,
                      y, batch_mean, batch_variance, saved_mean, saved_variance, fusion=None):
    cdef cfbn_shape s
    cdef cfbn_fusion fu
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    _forward_inference(&s, x, scale, offset, mean, variance, epsilon, y, batch_mean,
                       batch_variance, saved_mean, saved_variance, _fusion(&fu, fusion))


def backward(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
             int n_threads, bint training, dy, x, scale, saved_mean, saved_variance,
             double epsilon, dx, scale_backprop, offset_backprop, fusion=None):
    cdef cfbn_shape s
    cdef cfbn_fusion fu
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    _backward(&s, training, dy, x, scale, saved_mean, saved_variance, epsilon, dx,
              scale_backprop, offset_backprop, _fusion(&fu, fusion))


def backward_backward(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                      int n_threads, bint training, dy, x, scale, saved_mean, saved_variance,
                      double epsilon, ggx, ggscale, ggoffset, ddy, dx, scale_backprop):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    _backward_backward(&s, training, dy, x, scale, saved_mean, saved_variance, epsilon, ggx,
                       ggscale, ggoffset, ddy, dx, scale_backprop)


def statistics(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
               int n_threads, x, mean, m2):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    cdef void *px = _ptr(x)
    cdef double *pmean = <double *>_ptr(mean)
    cdef double *pm2 = <double *>_ptr(m2)
    cdef int rc
    with nogil:
        rc = cfbn_statistics(_table, &s, px, pmean, pm2)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def train_statistics(int64_t count, const double[::1] mean not None,
                     const double[::1] m2 not None, double factor,
                     const double[::1] running_mean, const double[::1] running_variance,
                     double[::1] variance not None, double[::1] batch_mean not None,
                     double[::1] batch_variance not None):
    """The biased variance and running outputs of merged (count, mean, m2),
    as cfbn_forward_training computes them.  float64 vectors of one length;
    the running ones are read only when factor != 1 (else they may be None)."""
    cdef Py_ssize_t channels = mean.shape[0]
    cdef bint running = factor != 1.0
    if (m2.shape[0] != channels or variance.shape[0] != channels
            or batch_mean.shape[0] != channels or batch_variance.shape[0] != channels
            or (running and (running_mean is None or running_variance is None
                             or running_mean.shape[0] != channels
                             or running_variance.shape[0] != channels))):
        raise ValueError("train_statistics: expected float64 vectors of one length")
    if channels == 0:
        return
    cdef const double *prm = &running_mean[0] if running else NULL
    cdef const double *prv = &running_variance[0] if running else NULL
    with nogil:
        cfbn_train_statistics(channels, count, &mean[0], &m2[0], factor, prm, prv,
                              &variance[0], &batch_mean[0], &batch_variance[0])


def apply(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
          int n_threads, x, scale, offset, mean, variance, double epsilon, y):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef void *poffset = _ptr(offset)
    cdef double *pmean = <double *>_ptr(mean)
    cdef double *pvar = <double *>_ptr(variance)
    cdef void *py = _ptr(y)
    cdef int rc
    with nogil:
        rc = cfbn_apply(_table, &s, px, pscale, poffset, pmean, pvar, epsilon, py)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def grad_statistics(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                    int n_threads, dy, x, mean, variance, double epsilon, sum_dy, sum_dy_xhat):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef double *pmean = <double *>_ptr(mean)
    cdef double *pvar = <double *>_ptr(variance)
    cdef double *psdy = <double *>_ptr(sum_dy)
    cdef double *psdx = <double *>_ptr(sum_dy_xhat)
    cdef int rc
    with nogil:
        rc = cfbn_grad_statistics(_table, &s, pdy, px, pmean, pvar, epsilon, psdy, psdx)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def grad_apply(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
               int n_threads, dy, x, scale, mean, variance, double epsilon, sum_dy, sum_dy_xhat,
               double count, dx):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
    cdef void *pdy = _ptr(dy)
    cdef void *px = _ptr(x)
    cdef void *pscale = _ptr(scale)
    cdef double *pmean = <double *>_ptr(mean)
    cdef double *pvar = <double *>_ptr(variance)
    cdef double *psdy = <double *>_ptr(sum_dy)
    cdef double *psdx = <double *>_ptr(sum_dy_xhat)
    cdef void *pdx = _ptr(dx)
    cdef int rc
    with nogil:
        rc = cfbn_grad_apply(_table, &s, pdy, px, pscale, pmean, pvar, epsilon, psdy, psdx,
                             count, pdx)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def _select_at_import():
    forced = os.environ.get("CFBN_FORCE_ISA", "")
    if forced:
        select_isa(forced, "CFBN_FORCE_ISA")
    else:
        select_default()


_select_at_import()


def set_trace(on):
    """Turn the route trace (one line per driver call on stderr) on or off;
    returns whether it was on."""
    was = bool(cfbn_trace_enabled())
    cfbn_set_trace(1 if on else 0)
    return was


def trace_enabled():
    """Whether the route trace is on."""
    return bool(cfbn_trace_enabled())


def _trace_at_import():
    text = os.environ.get("CFBN_VERBOSE", "")
    if text not in ("", "0", "1"):
        raise ValueError("CFBN_VERBOSE=%r: expected 1 (trace every call) or 0" % text)
    set_trace(text == "1")


_trace_at_import()


# ---- outputs: large ones through the output cache (out_cache.h) ----
#
# NumPy lets a caller choose the allocator of the arrays it creates (NEP 49,
# a handler in a context variable).  Large outputs are created under a
# handler that wraps NumPy's default one and keeps freed buffers for reuse;
# they are ordinary arrays that own their data.  A handler the user chose
# is left alone.

cdef mem_handler _cache_handler
cdef object _cache_capsule = None
cdef object _default_handler = None
cdef size_t _cache_limit = 0


def _init_output_cache(size_t limit):
    global _cache_capsule, _default_handler, _cache_limit
    _default_handler = <object>PyDataMem_DefaultHandler
    cdef mem_handler *d = <mem_handler *>PyCapsule_GetPointer(
        _default_handler, "mem_handler")
    cfbn_cache_init(<cfbn_allocator *>&d.allocator, limit)
    strncpy(_cache_handler.name, b"cfbn_output_cache", 126)
    _cache_handler.version = d.version
    cfbn_cache_allocator(<cfbn_allocator *>&_cache_handler.allocator)
    _cache_capsule = PyCapsule_New(&_cache_handler, "mem_handler", NULL)
    _cache_limit = limit


cdef inline bint _cacheable(size_t nbytes):
    return (_cache_limit >= nbytes >= CFBN_CACHE_MIN_BYTES
            and mem_get_handler() is _default_handler)


cdef object _empty_cached(shape, dt):
    """np.empty(shape, dt) with the output cache's handler current."""
    mem_set_handler(_cache_capsule)
    try:
        return np.empty(shape, dt)
    finally:
        mem_set_handler(_default_handler)


cdef cnp.ndarray _empty_output(cnp.ndarray like):
    """An uninitialized array of like's shape and type."""
    if _cacheable(<size_t>cnp.PyArray_NBYTES(like)):
        return _empty_cached((<object>like).shape, (<object>like).dtype)
    return cnp.PyArray_EMPTY(cnp.PyArray_NDIM(like), cnp.PyArray_DIMS(like), cnp.PyArray_TYPE(like), 0)


def empty_output(shape, dtype):
    """np.empty(shape, dtype), through the output cache when large."""
    dt = np.dtype(dtype)
    cdef size_t nbytes = dt.itemsize
    for n in shape:
        nbytes *= <size_t>n
    return _empty_cached(shape, dt) if _cacheable(nbytes) else np.empty(shape, dt)


def set_output_cache_limit(size_t limit):
    """Set the cache's byte limit; returns the previous one."""
    global _cache_limit
    _cache_limit = limit
    return cfbn_cache_set_limit(limit)


def release_output_cache():
    cfbn_cache_release()


def output_cache_stats():
    cdef cfbn_cache_stats st
    cfbn_cache_stats_get(&st)
    return {"limit": st.limit, "held_bytes": st.held_bytes, "held_buffers": st.held_buffers,
            "hits": st.hits, "misses": st.misses, "min_bytes": CFBN_CACHE_MIN_BYTES}


def _default_cache_limit():
    """CFBN_OUTPUT_CACHE_MB when set, else 1/16 of this machine's memory up to 1 GiB."""
    text = os.environ.get("CFBN_OUTPUT_CACHE_MB", "")
    if text:
        try:
            mb = int(text)
        except ValueError:
            mb = -1
        if not 0 <= mb < 1 << 43:
            raise ValueError("CFBN_OUTPUT_CACHE_MB=%r: expected a whole number of MiB, 0 to 2**43 - 1"
                             % text)
        return mb << 20
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        ram = 0
    return min(1 << 30, ram // 16) if ram > 0 else 0


_init_output_cache(_default_cache_limit())


# ---- the common case without Python-level validation ----
#
# A training loop calls cfbn thousands of times a second on small tensors, so
# the plain call (NumPy arrays that are already contiguous, aligned and of
# matching dtypes, no out=) is recognized here and run without the Python
# layer's work.  These functions are no validator: they test identities
# (exact types, flags, shapes, equality with the tables cfbn._args gives
# them) and never raise for an argument; anything else returns None, and the
# caller hands the call to cfbn._args, which decides and words the error.

cdef dict _LAYOUT_CODES = {}
cdef object _forward_result = None
cdef object _grad_result = None
cdef tuple _FORWARD_FIELDS = ()
cdef tuple _GRAD_FIELDS = ()
# Per output, a bit per input that it may be exactly (an in-place update).
cdef tuple _FORWARD_IN_PLACE = ()
cdef tuple _GRAD_IN_PLACE = ()
cdef dict _ACTIVATIONS = {}
cdef object _grad_side_result = None
cdef tuple _GRAD_SIDE_FIELDS = ()
cdef object _grad_grad_result = None


cdef extern from *:
    """
    /* An instance of the tuple subclass cls (a result named tuple) holding
     * the items of the tuple items: what tuple.__new__(cls, items) does,
     * without the Python frame of the named tuple's own __new__. */
    static PyObject *cfbn_tuple_as(PyObject *cls, PyObject *items)
    {
        PyTypeObject *type = (PyTypeObject *)cls;
        Py_ssize_t n = PyTuple_GET_SIZE(items);
        PyObject *t = type->tp_alloc(type, n);
        if (t == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(items, i);
            Py_INCREF(item);
            PyTuple_SET_ITEM(t, i, item);
        }
        return t;
    }
    """
    object _result "cfbn_tuple_as"(object cls, tuple items)


def set_fast_path_rules(forward, grad, grad_side, grad_grad, layouts, channels_first, activations,
                        forward_in_place, grad_in_place):
    """The tables the fast paths recognize the plain call by, set once by
    cfbn._args: the result named tuples (their fields name the out= entries;
    grad_side is the gradient's with side_input_backprop, grad_grad the
    second-order gradient's), data_format ->
    (rank, channels first?), the layout code of channels first, activation
    name -> (code, default alpha or None), and per output field a bit mask
    of the inputs it may be exactly (forward inputs: x, scale, offset, mean,
    variance, side_input; gradient: y_backprop, x, scale, reserve_space_1,
    reserve_space_2, offset, side_input).  Until then they accept nothing."""
    global _forward_result, _grad_result, _FORWARD_FIELDS, _GRAD_FIELDS
    global _FORWARD_IN_PLACE, _GRAD_IN_PLACE, _LAYOUT_CODES, _ACTIVATIONS
    global _grad_side_result, _GRAD_SIDE_FIELDS, _grad_grad_result
    _grad_grad_result = grad_grad
    _LAYOUT_CODES = {name: (rank, channels_first if first else 0)
                     for name, (rank, first) in layouts.items()}
    # enum cfbn_activation is the one list of activations: the names and
    # codes here must be exactly its members
    by_code = {code: ("none" if name is None else name) for name, (code, _) in activations.items()}
    in_c = {code: cfbn_act_name(code).decode() for code in range(CFBN_ACT_COUNT)}
    if by_code != in_c:
        raise ImportError("cfbn: the activations %r are not enum cfbn_activation's %r" % (by_code, in_c))
    _ACTIVATIONS = {name: entry for name, entry in activations.items() if name is not None}
    _forward_result, _grad_result, _grad_side_result = forward, grad, grad_side
    _FORWARD_FIELDS, _GRAD_FIELDS = tuple(forward._fields), tuple(grad._fields)
    _GRAD_SIDE_FIELDS = tuple(grad_side._fields)
    _FORWARD_IN_PLACE, _GRAD_IN_PLACE = tuple(forward_in_place), tuple(grad_in_place)


cdef inline int _plain_activation(object activation, object alpha, double *act_alpha) except -2:
    """The activation code of a plain activation= / alpha= pair (alpha a
    finite float where the activation takes one), 0 for none, or -1 for
    anything the validator must look at."""
    act_alpha[0] = 0.0
    if activation is None:
        return 0 if alpha is None else -1
    if type(activation) is not str:
        return -1
    entry = _ACTIVATIONS.get(activation)
    if entry is None:
        return -1
    code, default = entry
    if default is None:
        if alpha is not None:
            return -1
    elif alpha is None:
        act_alpha[0] = default
    elif type(alpha) is float and cfbn_finite_ok(<double>alpha):
        act_alpha[0] = alpha
    else:
        return -1
    return code


# NumPy type number of ml_dtypes.bfloat16, a user-defined type whose number
# is fixed only when ml_dtypes registers it; -1 until cfbn._args has
# recognized one (before that, a bfloat16 call takes the general path).
cdef int _bfloat16_type = -1


def set_bfloat16_type(int typenum):
    """Let the fast paths take arrays of NumPy type `typenum` as bfloat16
    (kernel dtype code 3); set by cfbn._args when it accepts that dtype."""
    global _bfloat16_type
    _bfloat16_type = typenum


cdef inline int _kind(object a) except -2:
    """Kernel dtype code of a plain C-contiguous aligned native array, else -1."""
    if type(a) is not cnp.ndarray:
        return -1
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if not (cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr)):
        return -1
    cdef int t = cnp.PyArray_TYPE(arr)
    if t == cnp.NPY_FLOAT:
        return 0
    if t == cnp.NPY_DOUBLE:
        return 1
    if t == cnp.NPY_FLOAT16:
        return 2
    if t == _bfloat16_type and t >= 0:
        return 3
    return -1


cdef inline bint _plain_vector(object v, int vtype, int64_t channels):
    if type(v) is not cnp.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>v
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_DIM(arr, 0) == channels
            and cnp.PyArray_TYPE(arr) == vtype and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_ISALIGNED(arr) and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline int _plain_threads(object n_threads):
    """n_threads as the C driver takes it (0 = OpenMP default), or -1."""
    if n_threads is None:
        return 0
    if type(n_threads) is not int:
        return -1
    cdef int overflow = 0
    cdef long long n = PyLong_AsLongLongAndOverflow(n_threads, &overflow)
    if overflow or not cfbn_threads_ok(n):
        return -1
    return <int>n


cdef inline int _geometry(cnp.ndarray x, object data_format, int *layout, int64_t *outer,
                          int64_t *channels, int64_t *inner):
    """Layout and (outer, channels, inner) of x, or -1 if not the plain case."""
    if type(data_format) is not str:
        return -1
    spec = _LAYOUT_CODES.get(data_format)
    if spec is None:
        return -1
    cdef int rank = spec[0]
    cdef int nd = cnp.PyArray_NDIM(x)
    if nd != rank:
        return -1
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(x)
    cdef int i
    layout[0] = spec[1]
    outer[0] = 1
    inner[0] = 1
    if layout[0] == 1:
        outer[0] = dims[0]
        channels[0] = dims[1]
        for i in range(2, nd):
            inner[0] *= dims[i]
    else:
        channels[0] = dims[nd - 1]
        for i in range(nd - 1):
            outer[0] *= dims[i]
    return 0


cdef inline cnp.ndarray _empty_like_vec(int64_t channels, int vtype):
    cdef cnp.npy_intp dim = channels
    return cnp.PyArray_EMPTY(1, &dim, vtype, 0)


cdef object _given_outputs(object out, tuple fields):
    """The caller's array or None for each field, or None when out= is not
    a plain tuple, list or dict of them."""
    if out is None:
        return (None,) * len(fields)
    cdef type t = type(out)
    if t is tuple or t is list:
        return out if len(out) == len(fields) else None
    if t is dict:
        for key in out:
            if key not in fields:
                return None
        return tuple([out.get(f) for f in fields])
    return None


cdef inline bint _plain_out(object a, cnp.ndarray like, int typenum):
    """A writeable, aligned, C-contiguous ndarray of `like`'s shape and the
    given type."""
    if type(a) is not cnp.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_SAMESHAPE(arr, like)
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISWRITEABLE(arr) and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline bint _plain_out_vec(object a, int64_t channels, int typenum):
    if type(a) is not cnp.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_DIM(arr, 0) == channels
            and cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_ISALIGNED(arr) and cnp.PyArray_ISWRITEABLE(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline bint _touch(object a, object b, bint same_is_clash):
    """Whether two contiguous arrays' bytes intersect; an identical range
    counts only when same_is_clash."""
    if a is None or b is None:
        return False
    cdef char *pa = <char *>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef char *pb = <char *>cnp.PyArray_DATA(<cnp.ndarray>b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(<cnp.ndarray>a)
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(<cnp.ndarray>b)
    if na == 0 or nb == 0:
        return False
    if pa == pb and na == nb:
        return same_is_clash
    return pa < pb + nb and pb < pa + na


def overlaps(a, b):
    """True when two C-contiguous arrays' byte ranges intersect but are not
    the very same range (the same range may be an in-place call)."""
    return _touch(a, b, False)


def touches(a, b):
    """True when two C-contiguous arrays' byte ranges intersect at all."""
    return _touch(a, b, True)


cdef bint _outputs_clash(tuple given, tuple inputs, tuple in_place):
    """An output touching an input's memory, unless it is exactly the input
    bit in_place[i] allows (an in-place update, of the same shape and type
    by the fast paths' checks), or two outputs sharing memory: the general
    path explains which."""
    cdef Py_ssize_t i, j
    cdef long allowed
    for i in range(len(given)):
        if given[i] is None:
            continue
        allowed = in_place[i]
        for j in range(len(inputs)):
            if _touch(given[i], inputs[j], not ((allowed >> j) & 1)):
                return True
        for j in range(i):
            if _touch(given[i], given[j], True):
                return True
    return False



def fast_forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                 data_format, is_training, n_threads, out=None, activation=None, alpha=None,
                 side_input=None):
    """fused_batch_norm for the plain case (a fused activation and side
    input included), or None for any other call."""
    if _forward_result is None:
        return None
    cdef int dt = _kind(x)
    if dt < 0 or type(epsilon) is not float or type(exponential_avg_factor) is not float:
        return None
    cdef double act_alpha
    cdef int act = _plain_activation(activation, alpha, &act_alpha)
    if act < 0:
        return None
    if side_input is not None and (_kind(side_input) != dt or not cnp.PyArray_SAMESHAPE(
            <cnp.ndarray>x, <cnp.ndarray>side_input)):
        return None
    if is_training is not True and is_training is not False:
        return None
    cdef double eps = epsilon
    cdef double factor = exponential_avg_factor
    if not (cfbn_epsilon_ok(eps) and cfbn_factor_ok(factor)):
        return None
    cdef int nt = _plain_threads(n_threads)
    if nt < 0:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int layout
    cdef int64_t outer, channels, inner
    if _geometry(xa, data_format, &layout, &outer, &channels, &inner) < 0:
        return None
    cdef int vtype = cnp.NPY_DOUBLE if dt == 1 else cnp.NPY_FLOAT
    cdef bint training = is_training
    cdef bint need_stats = (not training) or factor != 1.0
    if not (_plain_vector(scale, vtype, channels) and _plain_vector(offset, vtype, channels)):
        return None
    if need_stats and not (_plain_vector(mean, vtype, channels)
                           and _plain_vector(variance, vtype, channels)):
        return None
    if not need_stats and ((mean is not None and not _plain_vector(mean, vtype, channels))
                           or (variance is not None and not _plain_vector(variance, vtype, channels))):
        return None
    given = _given_outputs(out, _FORWARD_FIELDS)
    if given is None:
        return None
    given = tuple(given)
    y, bm, bv, sm, sv = given
    if y is None:
        y = _empty_output(xa)
    elif not _plain_out(y, xa, cnp.PyArray_TYPE(xa)):
        return None
    for v in (bm, bv, sm, sv):
        if v is not None and not _plain_out_vec(v, channels, vtype):
            return None
    if out is not None and _outputs_clash(given, (x, scale, offset, mean, variance, side_input),
                                          _FORWARD_IN_PLACE):
        return None
    if bm is None:
        bm = _empty_like_vec(channels, vtype)
    if bv is None:
        bv = _empty_like_vec(channels, vtype)
    if sm is None:
        sm = _empty_like_vec(channels, vtype)
    if sv is None:
        sv = _empty_like_vec(channels, vtype)
    cdef cfbn_shape s
    _shape(&s, dt, layout, outer, channels, inner, nt)
    cdef cfbn_fusion fu
    cdef const cfbn_fusion *pfu = NULL
    if act or side_input is not None:
        pfu = _set_fusion(&fu, act, act_alpha, side_input, None, None)
    if training:
        _forward_training(&s, x, scale, offset, mean if need_stats else None,
                          variance if need_stats else None, eps, factor, y, bm, bv, sm, sv, pfu)
    else:
        _forward_inference(&s, x, scale, offset, mean, variance, eps, y, bm, bv, sm, sv, pfu)
    return _result(_forward_result, (y, bm, bv, sm, sv))


def fast_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
                  data_format, is_training, n_threads, out=None, offset=None, activation=None,
                  alpha=None, side_input=None):
    """fused_batch_norm_grad for the plain case (a fused activation and side
    input included), or None for any other call."""
    if _grad_result is None:
        return None
    cdef int dt = _kind(x)
    if dt < 0 or _kind(y_backprop) != dt or type(epsilon) is not float:
        return None
    cdef double act_alpha
    cdef int act = _plain_activation(activation, alpha, &act_alpha)
    if act < 0 or (act and offset is None):
        return None
    if side_input is not None and (_kind(side_input) != dt or not cnp.PyArray_SAMESHAPE(
            <cnp.ndarray>x, <cnp.ndarray>side_input)):
        return None
    if is_training is not True and is_training is not False:
        return None
    cdef double eps = epsilon
    if not cfbn_epsilon_ok(eps):
        return None
    cdef int nt = _plain_threads(n_threads)
    if nt < 0:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef cnp.ndarray dya = <cnp.ndarray>y_backprop
    if not cnp.PyArray_SAMESHAPE(xa, dya):
        return None
    cdef int layout
    cdef int64_t outer, channels, inner
    if _geometry(xa, data_format, &layout, &outer, &channels, &inner) < 0:
        return None
    cdef int vtype = cnp.NPY_DOUBLE if dt == 1 else cnp.NPY_FLOAT
    if not (_plain_vector(scale, vtype, channels) and _plain_vector(reserve_space_1, vtype, channels)
            and _plain_vector(reserve_space_2, vtype, channels)):
        return None
    if offset is not None and not _plain_vector(offset, vtype, channels):
        return None
    cdef bint with_side = side_input is not None
    given = _given_outputs(out, _GRAD_SIDE_FIELDS if with_side else _GRAD_FIELDS)
    if given is None:
        return None
    given = tuple(given)
    dx, dscale, doffset = given[:3]
    side_grad = given[3] if with_side else None
    if with_side:
        if side_grad is None:
            side_grad = _empty_output(xa)
        elif not _plain_out(side_grad, xa, cnp.PyArray_TYPE(xa)):
            return None
    if dx is None:
        dx = _empty_output(xa)
    elif not _plain_out(dx, xa, cnp.PyArray_TYPE(xa)):
        return None
    for v in (dscale, doffset):
        if v is not None and not _plain_out_vec(v, channels, vtype):
            return None
    if out is not None and _outputs_clash(
            given, (y_backprop, x, scale, reserve_space_1, reserve_space_2, offset, side_input),
            _GRAD_IN_PLACE):
        return None
    if dscale is None:
        dscale = _empty_like_vec(channels, vtype)
    if doffset is None:
        doffset = _empty_like_vec(channels, vtype)
    cdef cfbn_shape s
    _shape(&s, dt, layout, outer, channels, inner, nt)
    cdef cfbn_fusion fu
    cdef const cfbn_fusion *pfu = NULL
    if act or with_side:
        pfu = _set_fusion(&fu, act, act_alpha, side_input, offset, side_grad)
    _backward(&s, is_training, y_backprop, x, scale, reserve_space_1, reserve_space_2, eps, dx,
              dscale, doffset, pfu)
    if with_side:
        return _result(_grad_side_result, (dx, dscale, doffset, side_grad))
    return _result(_grad_result, (dx, dscale, doffset))


def fast_grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, grad_x_backprop,
                   grad_scale_backprop, grad_offset_backprop, epsilon, data_format, is_training,
                   n_threads, out):
    """fused_batch_norm_grad_grad for the plain call without out=, or None
    for any other call."""
    if _grad_grad_result is None or out is not None:
        return None
    cdef int dt = _kind(x)
    if dt < 0 or _kind(y_backprop) != dt or type(epsilon) is not float:
        return None
    if is_training is not True and is_training is not False:
        return None
    cdef double eps = epsilon
    if not cfbn_epsilon_ok(eps):
        return None
    cdef int nt = _plain_threads(n_threads)
    if nt < 0:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    if not cnp.PyArray_SAMESHAPE(xa, <cnp.ndarray>y_backprop):
        return None
    if grad_x_backprop is not None and (_kind(grad_x_backprop) != dt or not cnp.PyArray_SAMESHAPE(
            xa, <cnp.ndarray>grad_x_backprop)):
        return None
    cdef int layout
    cdef int64_t outer, channels, inner
    if _geometry(xa, data_format, &layout, &outer, &channels, &inner) < 0:
        return None
    cdef int vtype = cnp.NPY_DOUBLE if dt == 1 else cnp.NPY_FLOAT
    for v in (scale, reserve_space_1, reserve_space_2):
        if not _plain_vector(v, vtype, channels):
            return None
    for v in (grad_scale_backprop, grad_offset_backprop):
        if v is not None and not _plain_vector(v, vtype, channels):
            return None
    ddy = _empty_output(xa)
    dx = _empty_output(xa)
    dscale = _empty_like_vec(channels, vtype)
    cdef cfbn_shape s
    _shape(&s, dt, layout, outer, channels, inner, nt)
    _backward_backward(&s, is_training, y_backprop, x, scale, reserve_space_1, reserve_space_2,
                       eps, grad_x_backprop, grad_scale_backprop, grad_offset_backprop, ddy, dx,
                       dscale)
    return _result(_grad_grad_result, (ddy, dx, dscale))


# ---- the C API for other extensions (csrc/c_api.h) ----
# The driver's entry points on the selected table, for cfbn.torch's
# operator, which calls them from C++ without Python in between.
c_api = PyCapsule_New(<void *>cfbn_c_api_get(), b"cfbn._kernels.c_api", NULL)
