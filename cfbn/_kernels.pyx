# cython: language_level=3
"""Thin wrapper over the C driver: pointers in, GIL released, nothing else.

Arguments arrive already validated by cfbn._api (dtype, shape, contiguity);
this layer only takes data pointers and calls the kernels with the GIL
released.  The kernel table is chosen once, when this module is imported.
"""
import os

cimport numpy as cnp
from libc.stdint cimport int64_t

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
    int CFBN_ISA_COUNT
    const char *cfbn_isa_name(int isa)
    int cfbn_isa_compiled(int isa)
    int cfbn_isa_supported(int isa)
    int cfbn_isa_best()
    const cfbn_kernels *cfbn_isa_table(int isa)
    int cfbn_forward_training(const cfbn_kernels *k, const cfbn_shape *s,
                              const void *x, const void *scale, const void *offset,
                              const void *mean, const void *variance,
                              double epsilon, double factor,
                              void *y, void *batch_mean, void *batch_variance,
                              void *saved_mean, void *saved_variance) nogil
    int cfbn_forward_inference(const cfbn_kernels *k, const cfbn_shape *s,
                               const void *x, const void *scale, const void *offset,
                               const void *mean, const void *variance, double epsilon,
                               void *y, void *batch_mean, void *batch_variance,
                               void *saved_mean, void *saved_variance) nogil
    int cfbn_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                      const void *dy, const void *x, const void *scale,
                      const void *saved_mean, const void *saved_variance, double epsilon,
                      void *dx, void *scale_backprop, void *offset_backprop) nogil
    int cfbn_openmp_enabled()
    int cfbn_openmp_max_threads()

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
    """Make `name` the active kernel table (for tests; not thread-safe)."""
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


def openmp_enabled():
    return bool(cfbn_openmp_enabled())


def max_threads():
    """Threads a call uses when n_threads is None (OpenMP's default)."""
    return cfbn_openmp_max_threads()


cdef inline void *_ptr(object a):
    if a is None:
        return NULL
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline int _shape(cfbn_shape *s, int dtype, int layout, int64_t outer, int64_t channels,
                       int64_t inner, int n_threads) except -1:
    s.dtype = dtype
    s.layout = layout
    s.outer = outer
    s.channels = channels
    s.inner = inner
    s.n_threads = n_threads if n_threads > 0 else cfbn_openmp_max_threads()
    return 0


def forward_training(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                     int n_threads, x, scale, offset, mean, variance, double epsilon,
                     double factor, y, batch_mean, batch_variance, saved_mean, saved_variance):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
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
        rc = cfbn_forward_training(_table, &s, px, pscale, poffset, pmean, pvar, epsilon, factor,
                                   py, pbm, pbv, psm, psv)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def forward_inference(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                      int n_threads, x, scale, offset, mean, variance, double epsilon,
                      y, batch_mean, batch_variance, saved_mean, saved_variance):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
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
        rc = cfbn_forward_inference(_table, &s, px, pscale, poffset, pmean, pvar, epsilon,
                                    py, pbm, pbv, psm, psv)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def backward(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
             int n_threads, bint training, dy, x, scale, saved_mean, saved_variance,
             double epsilon, dx, scale_backprop, offset_backprop):
    cdef cfbn_shape s
    _shape(&s, dtype, layout, outer, channels, inner, n_threads)
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
        rc = cfbn_backward(_table, &s, training, pdy, px, pscale, psm, psv, epsilon,
                           pdx, psb, pob)
    if rc != 0:
        raise MemoryError("cfbn: out of memory for scratch buffers")


def overlaps(a, b):
    """True when two C-contiguous arrays' byte ranges intersect but are not
    the very same range (the same range is an in-place call)."""
    cdef cnp.ndarray aa = <cnp.ndarray>a
    cdef cnp.ndarray bb = <cnp.ndarray>b
    cdef char *pa = <char *>cnp.PyArray_DATA(aa)
    cdef char *pb = <char *>cnp.PyArray_DATA(bb)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(aa)
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(bb)
    if na == 0 or nb == 0:
        return False
    if pa == pb and na == nb:
        return False
    return pa < pb + nb and pb < pa + na


def _select_at_import():
    forced = os.environ.get("CFBN_FORCE_ISA", "")
    if forced:
        select_isa(forced, "CFBN_FORCE_ISA")
    else:
        select_isa(cfbn_isa_name(cfbn_isa_best()).decode())


_select_at_import()
