"""cfbn.torch's operators in an installed wheel: the operator library against
the Python operators and cfbn.reference, forward, backward and double
backward, on a few shapes.  Made for an emulated aarch64 torch, where every
torch call is slow: a few seconds of torch work, no pytest.

    python check_torch_ops.py save FILE      the library's results into FILE
    CFBN_TORCH_LIBRARY=0 python check_torch_ops.py compare FILE
                                             the Python operators' results,
                                             compared bit for bit with FILE,
                                             and both with cfbn.reference
"""
import os
import sys

import numpy as np
import torch

import cfbn
import cfbn.torch as ct
from cfbn import reference
from cfbn.torch import ops

# (shape, dtype, memory format, training, activation, side input, affine)
CASES = [
    ((6, 5), torch.float64, None, True, None, False, True),
    ((4, 3, 5, 7), torch.float64, None, True, None, False, True),
    ((4, 3, 5, 7), torch.float32, torch.channels_last, True, "relu", True, True),
    ((2, 3, 2, 3, 4), torch.float64, None, False, None, False, True),
    ((2, 3, 2, 3, 4), torch.float32, torch.channels_last_3d, True, "silu", False, False),
    ((4, 3, 5, 7), torch.bfloat16, None, True, None, False, True),
]
LAYOUT = {2: "NC", 4: "NCHW", 5: "NCDHW"}
EPS, MOMENTUM = 1e-3, 0.1


def inputs(case, seed):
    """Every tensor a case takes, drawn from one seeded generator."""
    shape, dtype, memory, training, act, side, affine = case
    g = torch.Generator().manual_seed(seed)
    vd = torch.float64 if dtype is torch.float64 else torch.float32
    c = shape[1]

    def draw(*size, dt=dtype, scale=1.0, shift=0.0):
        return (torch.randn(*size, generator=g, dtype=torch.float64) * scale + shift).to(dt)

    x = draw(*shape, scale=3.0, shift=5.0)
    return {"x": x if memory is None else x.contiguous(memory_format=memory),
            "w": (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(vd) if affine else None,
            "b": draw(c, dt=vd) if affine else None,
            "rm": draw(c, dt=vd), "rv": (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(vd),
            "side": draw(*shape) if side else None, "dy": draw(*shape),
            "ggx": draw(*shape), "ggw": draw(c, dt=vd), "ggb": draw(c, dt=vd)}


def run(case, inp):
    """Forward (with the running statistics it updates), gradients and,
    without an activation, second derivatives through the public API."""
    shape, dtype, memory, training, act, side, affine = case
    x, dy = inp["x"].clone().requires_grad_(), inp["dy"].clone().requires_grad_()
    w, b = [None if v is None else v.clone().requires_grad_() for v in (inp["w"], inp["b"])]
    rm, rv = inp["rm"].clone(), inp["rv"].clone()
    y = ct.batch_norm(x, rm, rv, w, b, training, MOMENTUM, EPS, activation=act,
                      side_input=inp["side"])
    second = act is None and dtype is not torch.bfloat16
    grads = torch.autograd.grad(y, [x] + ([w, b] if affine else []), dy, create_graph=second)
    out = {"y": y.detach(), "rm": rm, "rv": rv, "grads": [v.detach() for v in grads]}
    if second:
        loss = (grads[0] * inp["ggx"]).sum() + (grads[1] * inp["ggw"]).sum() + (grads[2] * inp["ggb"]).sum()
        out["gg"] = [v.detach() for v in torch.autograd.grad(loss, [dy, x, w])]
    return out


def against_reference(case, inp, got):
    """The float64 reference (cfbn.reference: the formulas of docs/spec.md)."""
    shape, dtype, memory, training, act, side, affine = case
    tol = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 3e-2}[dtype]
    fmt = LAYOUT[len(shape)]
    n = {k: None if v is None else v.double().numpy() for k, v in inp.items()}
    c = shape[1]
    scale = n["w"] if affine else np.ones(c)
    offset = n["b"] if affine else np.zeros(c)
    ref = reference.fused_batch_norm(n["x"], scale, offset, n["rm"], n["rv"], epsilon=EPS,
                                     data_format=fmt, is_training=training, activation=act,
                                     side_input=n["side"])
    close(got["y"], ref.y, tol, "y")
    grad = reference.fused_batch_norm_grad(n["dy"], n["x"], scale, ref.reserve_space_1,
                                           ref.reserve_space_2, epsilon=EPS, data_format=fmt,
                                           is_training=training, offset=offset, activation=act,
                                           side_input=n["side"])
    for v, r, what in zip(got["grads"], grad, ["dx", "dweight", "dbias"]):
        close(v, r, tol, what)
    if "gg" in got:
        gg = reference.fused_batch_norm_grad_grad(n["dy"], n["x"], scale, ref.reserve_space_1,
                                                  ref.reserve_space_2, n["ggx"], n["ggw"], n["ggb"],
                                                  epsilon=EPS, data_format=fmt, is_training=training)
        for v, r, what in zip(got["gg"], gg, ["d(dy)", "d2x", "d2weight"]):
            close(v, r, tol, what)


def close(t, ref, tol, what):
    a = t.double().numpy()
    err = float(np.max(np.abs(a - ref) / (np.abs(ref) + 1.0))) if a.size else 0.0
    assert err <= tol, "%s: %.3g from the reference (tolerance %.3g)" % (what, err, tol)


def same(p, q, what):
    if isinstance(p, list):
        assert isinstance(q, list) and len(p) == len(q), what
        for i, (a, b) in enumerate(zip(p, q)):
            same(a, b, "%s[%d]" % (what, i))
        return
    assert p.dtype == q.dtype and p.shape == q.shape and p.stride() == q.stride(), what
    assert torch.equal(p, q), (what, float((p.double() - q.double()).abs().max()))


def describe(case):
    shape, dtype, memory, training, act, side, affine = case
    words = [str(tuple(shape)), str(dtype).replace("torch.", "")]
    words += [str(memory).replace("torch.", "")] if memory is not None else []
    words += ["training" if training else "inference"] + ([act] if act else [])
    words += ["+side"] if side else []
    words += [] if affine else ["no affine"]
    return " ".join(words)


def main(mode, path):
    print("torch", torch.__version__, "| cfbn", cfbn.__version__, "| ISA",
          cfbn.runtime_info()["selected_isa"], "| operators:",
          "library" if ops.NOT_LOADED is None else "Python (%s)" % ops.NOT_LOADED)
    results = [run(case, inputs(case, seed)) for seed, case in enumerate(CASES)]
    if mode == "save":
        assert ops.NOT_LOADED is None, ops.NOT_LOADED
        torch.save(results, path)
        print("the library's results for %d cases saved" % len(CASES))
        return
    assert ops.NOT_LOADED == "CFBN_TORCH_LIBRARY=0", ops.NOT_LOADED
    for seed, (case, lib, py) in enumerate(zip(CASES, torch.load(path), results)):
        assert lib.keys() == py.keys(), describe(case)
        for key in lib:
            same(lib[key], py[key], "%s: %s" % (describe(case), key))
        against_reference(case, inputs(case, seed), lib)
        print("ok %-48s library = Python operators, bit for bit; reference: y, gradients%s"
              % (describe(case), ", second derivatives" if "gg" in lib else ""))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "compare"):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
