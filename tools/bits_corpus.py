"""Hashes every output of a corpus of calls (18 shapes, 5 layouts, 4 dtypes, 1 and 2
threads, training and inference, every activation (and none) with and without a side input, the
gradient and the second-order gradient) under one ISA: a change meant to keep an
ISA's bits is checked by comparing the listing before and after.

usage: python tools/bits_corpus.py ISA OUTFILE   (ISA as CFBN_FORCE_ISA takes it)"""
import hashlib, sys, os
os.environ["CFBN_FORCE_ISA"] = sys.argv[1]
import numpy as np, ml_dtypes, cfbn
assert cfbn.runtime_info()["selected_isa"] == sys.argv[1]
SHAPES = [((4, 5, 7, 3), "NHWC"), ((2, 9, 9, 16), "NHWC"), ((3, 130), "NC"), ((2, 33, 5, 40), "NHWC"),
          ((8, 7, 7, 24), "NHWC"), ((2, 1, 1, 1000), "NHWC"), ((64, 12), "NC"), ((5, 6, 3, 100), "NHWC"),
          ((4, 3, 7, 5), "NCHW"), ((2, 16, 9, 9), "NCHW"), ((2, 8, 32, 32), "NCHW"), ((3, 4, 1, 77), "NCHW"),
          ((2, 3, 4, 5, 6), "NCDHW"), ((2, 4, 5, 6, 3), "NDHWC"), ((1, 1, 1, 1), "NHWC"), ((33, 3, 14, 14), "NCHW"),
          ((2, 64, 56, 56), "NCHW"), ((4, 28, 28, 64), "NHWC")]
DT = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
ACTS = [None, "relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "silu"]
h = hashlib.sha256(); lines = []
def feed(tag, arrs):
    hh = hashlib.sha256()
    for a in arrs:
        if a is None: continue
        a = np.ascontiguousarray(a); hh.update(a.tobytes())
    h.update(hh.digest()); lines.append("%s %s" % (tag, hh.hexdigest()[:16]))
for si, (shape, fmt) in enumerate(SHAPES):
    C = shape[fmt.index("C")]
    for dn, dt in DT.items():
        rng = np.random.default_rng(si * 10 + len(dn))
        x = (rng.standard_normal(shape) * 3 + 1.5).astype(dt)
        dy = rng.standard_normal(shape).astype(dt)
        side = rng.standard_normal(shape).astype(dt)
        vt = np.float64 if dt is np.float64 else np.float32
        sc = (rng.random(C) + 0.5).astype(vt); of = rng.standard_normal(C).astype(vt)
        mean = rng.standard_normal(C).astype(vt); var = (rng.random(C) + 0.3).astype(vt)
        for nt in (1, 2):
            for train in (True, False):
                for act in ACTS:
                    for sd in (None, side):
                        kw = dict(data_format=fmt, n_threads=nt, is_training=train, activation=act, side_input=sd)
                        if act in ("leaky_relu", "elu"): kw["alpha"] = 0.3
                        f = cfbn.fused_batch_norm(x, sc, of, mean, var, exponential_avg_factor=0.7, **kw)
                        feed("fwd %s %s %s nt%d tr%d %s side%d" % (shape, fmt, dn, nt, train, act, sd is not None), list(f))
                        gkw = dict(kw); gkw["offset"] = of if act else None
                        g = cfbn.fused_batch_norm_grad(dy, x, sc, f[3], f[4], **gkw)
                        feed("grad %s %s %s nt%d tr%d %s side%d" % (shape, fmt, dn, nt, train, act, sd is not None), list(g))
                ggx = rng.standard_normal(shape).astype(dt)
                gg = cfbn.fused_batch_norm_grad_grad(dy, x, sc, f[3], f[4], ggx, sc * 0.5, of,
                                                      data_format=fmt, is_training=train, n_threads=nt)
                feed("gg %s %s %s nt%d tr%d" % (shape, fmt, dn, nt, train), list(gg))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print(sys.argv[1], len(lines), h.hexdigest())
