// cfbn.torch's eager batch norm in C++: the forward, its autograd node and
// the first-order backward, calling cfbn's driver through the C API that
// cfbn._kernels exports (c_api.h), with no Python between the training
// loop's call and the kernels, nor between autograd and the gradient.
//
// It computes what cfbn.torch._bridge computes, with the same kernels, the
// same arguments and so the same bits, for the calls that need nothing but
// the kernels: CPU tensors of float32, float64, float16 or bfloat16, of 2 to
// 5 dimensions, not empty, contiguous or channels-last (any other layout is
// read through one contiguous copy, as the bridge does), per-channel tensors
// of the vector dtype (float64 for float64, else float32), a side input of
// the input's shape and dtype, and running statistics updated in place.
// For anything else `batch_norm` returns None and cfbn.torch runs the
// Python bridge, which computes the rest or raises cfbn's errors.
//
// A backward called with create_graph=True (a gradient to be differentiated
// again) is handed to the bridge's differentiable backward
// (cfbn.torch._eager.BatchNormBackwardFunction), with the GIL taken.
//
// forward_op and backward_op are the kernels of the operators
// torch.ops.cfbn.batch_norm and batch_norm_backward (cfbn/torch/ops.py, what
// compiled graphs call), under the same rules: the forward returns the new
// running statistics in new tensors instead of writing them.
#include <torch/extension.h>

#include <atomic>
#include <cmath>
#include <string>

#include "c_api.h"

namespace {

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const cfbn_c_api *api = nullptr;
std::atomic<long long> forward_calls{0}, backward_calls{0};

enum Kind { FIRST = 0, LAST = 1, OTHER = -1 };

int dtype_code(at::ScalarType t)
{
    switch (t) {
    case at::kFloat: return 0;
    case at::kDouble: return 1;
    case at::kHalf: return 2;
    case at::kBFloat16: return 3;
    default: return -1;
    }
}

// Whether t's strides are those of a dense tensor whose axes, from the
// slowest to the fastest, are `order` (size-1 axes may have any stride, as
// in PyTorch's own contiguity flags).
bool dense_in_order(const at::Tensor &t, const int64_t *order, int nd)
{
    int64_t expected = 1;
    for (int i = nd - 1; i >= 0; --i) {
        int64_t d = order[i], size = t.size(d);
        if (size != 1) {
            if (t.stride(d) != expected)
                return false;
            expected *= size;
        }
    }
    return true;
}

const int64_t FIRST_ORDER[5] = {0, 1, 2, 3, 4};
const int64_t LAST_ORDER[4][5] = {
    {0, 1}, {0, 2, 1}, {0, 2, 3, 1}, {0, 2, 3, 4, 1}};

// As the bridge's layout_kind: contiguous first (a contiguous (N, C) is
// channels last), then channels last.
Kind layout_kind(const at::Tensor &t)
{
    int nd = (int)t.dim();
    if (dense_in_order(t, FIRST_ORDER, nd))
        return nd == 2 ? LAST : FIRST;
    if (dense_in_order(t, LAST_ORDER[nd - 2], nd))
        return LAST;
    return OTHER;
}

// The per-channel vectors' dtype for an input: float64 for float64, else float32.
at::ScalarType vector_type(const at::Tensor &x)
{
    return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// x as the kernels read it, and its layout in `kind`: x itself, or for a
// layout they cannot read, one contiguous copy (channels first).
at::Tensor readable(const at::Tensor &x, Kind &kind)
{
    kind = layout_kind(x);
    if (kind != OTHER)
        return x;
    kind = FIRST;
    return x.contiguous();
}

// A tensor the kernels can read in layout `kind`: t itself, or one copy.
at::Tensor in_layout(const at::Tensor &t, Kind kind)
{
    if (layout_kind(t) == kind)
        return t;
    if (kind == FIRST || t.dim() == 2)
        return t.contiguous();
    if (t.dim() == 3)
        return t.transpose(1, 2).contiguous().transpose(1, 2);
    return t.contiguous(t.dim() == 4 ? at::MemoryFormat::ChannelsLast
                                     : at::MemoryFormat::ChannelsLast3d);
}

// An uninitialized tensor of like's shape and dtype in layout `kind`; from
// cfbn's output cache when large, as the bridge's outputs are.
at::Tensor output(const at::Tensor &like, Kind kind)
{
    int nd = (int)like.dim();
    const int64_t *order = kind == FIRST || nd == 2 ? FIRST_ORDER : LAST_ORDER[nd - 2];
    int64_t strides[5], expected = 1;
    for (int i = nd - 1; i >= 0; --i) {
        strides[order[i]] = expected;
        expected *= like.size(order[i]);
    }
    at::IntArrayRef st(strides, nd);
    size_t nbytes = (size_t)expected * like.element_size();
    void *p = api->output_alloc(nbytes);
    if (p == nullptr)
        return at::empty_strided(like.sizes(), st, like.options());
    return at::from_blob(
        p, like.sizes(), st, [nbytes](void *q) { api->output_free(q, nbytes); },
        like.options());
}

bool plain_tensor(const at::Tensor &t)
{
    // Tensors with a functorch, functionalization or Python key are not
    // plain memory: the bridge (or its refusal) handles them.
    static const c10::DispatchKeySet wrapped({
        c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
        c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
        c10::DispatchKey::Functionalize});
    return t.defined() && t.is_cpu() && t.layout() == at::kStrided && t.has_storage()
        && !t.is_conj() && !t.is_neg() && !t.key_set().has_any(wrapped);
}

// A per-channel tensor the kernels can take as it is.
bool plain_vector(const at::Tensor &v, at::ScalarType vdt, int64_t channels)
{
    return plain_tensor(v) && v.scalar_type() == vdt && v.dim() == 1 && v.size(0) == channels
        && (v.stride(0) == 1 || channels == 1);
}

// The bytes a tensor's elements lie in, [lo, hi); empty for none.
struct Span {
    uintptr_t lo, hi;
};

Span span_of(const at::Tensor &t)
{
    if (!t.defined() || t.numel() == 0)
        return {0, 0};
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d)
        last += (t.size(d) - 1) * t.stride(d);
    uintptr_t lo = (uintptr_t)t.data_ptr();
    return {lo, lo + (uintptr_t)((last + 1) * t.element_size())};
}

bool overlap(const at::Tensor &a, const at::Tensor &b)
{
    Span p = span_of(a), q = span_of(b);
    return p.lo < q.hi && q.lo < p.hi;
}

const void *ptr(const at::Tensor &t)
{
    return t.defined() ? t.data_ptr() : nullptr;
}

// The tensor's shape as cfbn's driver sees it in layout `kind`.
struct Shape {
    int dtype, layout;
    int64_t outer, channels, inner;
};

Shape shape_of(const at::Tensor &x, Kind kind)
{
    // enum cfbn_layout: 0 channels last, 1 channels first
    Shape s{dtype_code(x.scalar_type()), kind == FIRST ? 1 : 0, 0, x.size(1), 1};
    int64_t spatial = 1;
    for (int64_t d = 2; d < x.dim(); ++d)
        spatial *= x.size(d);
    if (kind == FIRST) {
        s.outer = x.size(0);
        s.inner = spatial;
    } else {
        s.outer = x.size(0) * spatial;
    }
    return s;
}

at::Tensor vector_or(const at::Tensor &v, const at::Tensor &x, at::ScalarType vdt, double value)
{
    if (v.defined())
        return v;
    return at::full({x.size(1)}, value, x.options().dtype(vdt));
}

void check(int rc)
{
    if (rc != 0)
        throw std::bad_alloc();
}

// What the backward needs besides the saved tensors; `activation` and
// `alpha_arg` as the caller gave them (None: empty), for the bridge.
struct Options {
    bool training;
    double eps;
    int act;
    double alpha;
    c10::optional<std::string> activation;
    c10::optional<double> alpha_arg;
};

// The forward of a checked call: (y, save_mean, save_var).  In training
// with running statistics, their new values go to new_mean and new_var: the
// running tensors themselves (an update in place) or new ones.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_kernels(
    const at::Tensor &x0, const at::Tensor &weight, const at::Tensor &bias,
    const at::Tensor &running_mean, const at::Tensor &running_var, const at::Tensor &side0,
    bool training, double factor, double eps, int act, double alpha, const at::Tensor &new_mean,
    const at::Tensor &new_var)
{
    Kind kind;
    at::Tensor x = readable(x0, kind);
    at::ScalarType vdt = vector_type(x);
    at::Tensor side = side0.defined() ? in_layout(side0, kind) : side0;
    Shape s = shape_of(x, kind);
    at::Tensor y = output(x, kind);
    at::Tensor save_mean = at::empty({s.channels}, x.options().dtype(vdt));
    at::Tensor save_var = at::empty({s.channels}, x.options().dtype(vdt));
    at::Tensor scale = vector_or(weight, x, vdt, 1.0), offset = vector_or(bias, x, vdt, 0.0);
    bool update = training && running_mean.defined();
    int rc;
    {
        py::gil_scoped_release nogil;
        if (!training) {
            rc = api->forward_inference(s.dtype, s.layout, s.outer, s.channels, s.inner, 0,
                                        ptr(x), ptr(scale), ptr(offset), ptr(running_mean),
                                        ptr(running_var), eps, y.data_ptr(),
                                        save_mean.data_ptr(), save_var.data_ptr(), act, alpha,
                                        ptr(side));
        } else {
            // Without running statistics, none are read or written (factor 1).
            // With them, they are read unless replaced (factor 1).
            double f = update ? factor : 1.0;
            bool read = update && f != 1.0;
            rc = api->forward_training(s.dtype, s.layout, s.outer, s.channels, s.inner, 0,
                                       ptr(x), ptr(scale), ptr(offset),
                                       read ? running_mean.data_ptr() : nullptr,
                                       read ? running_var.data_ptr() : nullptr, eps, f,
                                       y.data_ptr(), update ? new_mean.data_ptr() : nullptr,
                                       update ? new_var.data_ptr() : nullptr,
                                       save_mean.data_ptr(), save_var.data_ptr(), act, alpha,
                                       ptr(side));
        }
    }
    check(rc);
    forward_calls.fetch_add(1, std::memory_order_relaxed);
    return {y, save_mean, save_var};
}

// The first-order gradient: dx, dweight, dbias, dside (undefined without a side input).
variable_list backward_kernels(const at::Tensor &grad_out, const at::Tensor &x0,
                               const at::Tensor &weight, const at::Tensor &bias,
                               const at::Tensor &side0, const at::Tensor &save_mean,
                               const at::Tensor &save_var, const Options &o)
{
    Kind kind;
    at::Tensor x = readable(x0, kind);
    at::ScalarType vdt = save_mean.scalar_type();
    at::Tensor dy = in_layout(grad_out, kind);
    at::Tensor side = side0.defined() ? in_layout(side0, kind) : side0;
    Shape s = shape_of(x, kind);
    at::Tensor dx = output(x, kind);
    at::Tensor dside = side.defined() ? output(x, kind) : at::Tensor();
    at::Tensor dscale = at::empty({s.channels}, x.options().dtype(vdt));
    at::Tensor doffset = at::empty({s.channels}, x.options().dtype(vdt));
    at::Tensor scale = vector_or(weight, x, vdt, 1.0);
    at::Tensor offset = o.act != 0 ? vector_or(bias, x, vdt, 0.0) : at::Tensor();
    int rc = api->backward(s.dtype, s.layout, s.outer, s.channels, s.inner, 0, o.training,
                           ptr(dy), ptr(x), ptr(scale), ptr(save_mean), ptr(save_var), o.eps,
                           dx.data_ptr(), dscale.data_ptr(), doffset.data_ptr(), o.act, o.alpha,
                           ptr(side), ptr(offset), dside.defined() ? dside.data_ptr() : nullptr);
    check(rc);
    backward_calls.fetch_add(1, std::memory_order_relaxed);
    return {dx, dscale, doffset, dside};
}

Options options_of(AutogradContext *ctx)
{
    auto &d = ctx->saved_data;
    Options o{d["training"].toBool(), d["eps"].toDouble(), (int)d["act"].toInt(),
              d["alpha"].toDouble(), c10::nullopt, c10::nullopt};
    if (!d["activation"].isNone())
        o.activation = d["activation"].toStringRef();
    if (!d["alpha_arg"].isNone())
        o.alpha_arg = d["alpha_arg"].toDouble();
    return o;
}

// The bridge's differentiable backward, for create_graph=True.
variable_list differentiable_backward(const at::Tensor &grad_out, const at::Tensor &x,
                                      const at::Tensor &weight, const at::Tensor &bias,
                                      const at::Tensor &side, const at::Tensor &save_mean,
                                      const at::Tensor &save_var, const Options &o)
{
    py::gil_scoped_acquire gil;
    py::object fn = py::module_::import("cfbn.torch._eager").attr("BatchNormBackwardFunction");
    py::object activation = o.activation ? py::object(py::str(*o.activation)) : py::none();
    py::object alpha = o.alpha_arg ? py::object(py::float_(*o.alpha_arg)) : py::none();
    py::tuple options = py::make_tuple(o.training, o.eps, activation, alpha);
    auto opt = [](const at::Tensor &t) { return t.defined() ? py::cast(t) : py::none(); };
    py::tuple r = fn.attr("apply")(grad_out, x, opt(weight), opt(bias), opt(side), save_mean,
                                   save_var, options);
    variable_list out;
    for (auto item : r)
        out.push_back(item.is_none() ? at::Tensor() : item.cast<at::Tensor>());
    out.resize(4);
    return out;
}

// Function::apply takes defined tensors only: an absent one travels as an
// empty tensor (never a real argument: x is not empty here).
at::Tensor or_empty(const at::Tensor &t)
{
    return t.defined() ? t : at::empty({0});
}

at::Tensor present(const at::Tensor &t)
{
    return t.numel() == 0 ? at::Tensor() : t;
}

struct BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
    static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &weight_,
                              const at::Tensor &bias_, const at::Tensor &side_,
                              const at::Tensor &running_mean_, const at::Tensor &running_var_,
                              double factor, Options o)
    {
        at::Tensor weight = present(weight_), bias = present(bias_), side = present(side_);
        at::Tensor running_mean = present(running_mean_), running_var = present(running_var_);
        auto r = forward_kernels(x, weight, bias, running_mean, running_var, side, o.training,
                                 factor, o.eps, o.act, o.alpha, running_mean, running_var);
        // x and the parameters through save_for_backward, so that modifying
        // them in place before the backward is an error; the statistics are ours.
        ctx->save_for_backward({x, weight, bias, side});
        auto &d = ctx->saved_data;
        d["mean"] = std::get<1>(r);
        d["var"] = std::get<2>(r);
        d["training"] = o.training;
        d["eps"] = o.eps;
        d["act"] = (int64_t)o.act;
        d["alpha"] = o.alpha;
        d["activation"] = o.activation ? c10::IValue(*o.activation) : c10::IValue();
        d["alpha_arg"] = o.alpha_arg ? c10::IValue(*o.alpha_arg) : c10::IValue();
        return std::get<0>(r);
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        at::Tensor x = saved[0], weight = present(saved[1]), bias = present(saved[2]);
        at::Tensor side = present(saved[3]);
        at::Tensor save_mean = ctx->saved_data["mean"].toTensor();
        at::Tensor save_var = ctx->saved_data["var"].toTensor();
        Options o = options_of(ctx);
        variable_list g = at::GradMode::is_enabled()
            ? differentiable_backward(grads[0], x, weight, bias, side, save_mean, save_var, o)
            : backward_kernels(grads[0], x, weight, bias, side, save_mean, save_var, o);
        variable_list out(8);
        for (int i = 0; i < 4; ++i)
            if (ctx->needs_input_grad(i))
                out[i] = g[i];
        return out;
    }
};

// Whether the kernels can take a forward call as it is.  in_place: the
// running statistics are written where they are, so memory they share with
// each other or with an input is the validator's error to name.
bool takes(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias,
           const at::Tensor &running_mean, const at::Tensor &running_var,
           const at::Tensor &side, bool training, double factor, double eps, bool in_place)
{
    int64_t nd = x.dim();
    if (!plain_tensor(x) || dtype_code(x.scalar_type()) < 0 || nd < 2 || nd > 5
        || x.numel() == 0)
        return false;
    at::ScalarType vdt = vector_type(x);
    int64_t channels = x.size(1);
    for (const at::Tensor *v : {&weight, &bias, &running_mean, &running_var})
        if (v->defined() && !plain_vector(*v, vdt, channels))
            return false;
    if (running_mean.defined() != running_var.defined() || (!training && !running_mean.defined()))
        return false;
    if (side.defined() && (!plain_tensor(side) || side.scalar_type() != x.scalar_type()
                           || side.sizes() != x.sizes()))
        return false;
    if (!(eps >= 0.0 && std::isfinite(eps)) || !(factor >= 0.0 && factor <= 1.0))
        return false;
    if (in_place && training && running_mean.defined()) {
        for (const at::Tensor *out : {&running_mean, &running_var})
            for (const at::Tensor *in : {&x, &weight, &bias, &side})
                if (overlap(*out, *in))
                    return false;
        if (overlap(running_mean, running_var))
            return false;
    }
    return true;
}

// cfbn.torch.batch_norm's eager call: y, or None for a call the bridge takes.
py::object batch_norm(const at::Tensor &x, const c10::optional<at::Tensor> &weight_,
                      const c10::optional<at::Tensor> &bias_,
                      const c10::optional<at::Tensor> &running_mean_,
                      const c10::optional<at::Tensor> &running_var_,
                      const c10::optional<at::Tensor> &side_, bool training, double factor,
                      double eps, int act, double alpha, c10::optional<std::string> activation,
                      c10::optional<double> alpha_arg)
{
    at::Tensor weight = weight_.value_or(at::Tensor()), bias = bias_.value_or(at::Tensor());
    at::Tensor running_mean = running_mean_.value_or(at::Tensor());
    at::Tensor running_var = running_var_.value_or(at::Tensor());
    at::Tensor side = side_.value_or(at::Tensor());
    if (!takes(x, weight, bias, running_mean, running_var, side, training, factor, eps, true))
        return py::none();
    bool grad = at::GradMode::is_enabled()
        && (x.requires_grad() || (weight.defined() && weight.requires_grad())
            || (bias.defined() && bias.requires_grad())
            || (side.defined() && side.requires_grad()));
    if (!grad)
        return py::cast(std::get<0>(forward_kernels(x, weight, bias, running_mean, running_var,
                                                    side, training, factor, eps, act, alpha,
                                                    running_mean, running_var)));
    Options o{training, eps, act, alpha, activation, alpha_arg};
    return py::cast(BatchNormFunction::apply(x, or_empty(weight), or_empty(bias), or_empty(side),
                                             or_empty(running_mean), or_empty(running_var),
                                             factor, o));
}

// torch.ops.cfbn.batch_norm's implementation (a functional operator: the
// running statistics are read, their new values returned in new tensors):
// (y, save_mean, save_var, new_mean, new_var), or None for the bridge.
py::object forward_op(const at::Tensor &x, const c10::optional<at::Tensor> &weight_,
                      const c10::optional<at::Tensor> &bias_,
                      const c10::optional<at::Tensor> &running_mean_,
                      const c10::optional<at::Tensor> &running_var_,
                      const c10::optional<at::Tensor> &side_, bool training, double factor,
                      double eps, int act, double alpha)
{
    at::Tensor weight = weight_.value_or(at::Tensor()), bias = bias_.value_or(at::Tensor());
    at::Tensor running_mean = running_mean_.value_or(at::Tensor());
    at::Tensor running_var = running_var_.value_or(at::Tensor());
    at::Tensor side = side_.value_or(at::Tensor());
    if (!takes(x, weight, bias, running_mean, running_var, side, training, factor, eps, false))
        return py::none();
    at::TensorOptions vopt = x.options().dtype(vector_type(x));
    bool update = training && running_mean.defined();
    at::Tensor new_mean = at::empty({update ? x.size(1) : 0}, vopt);
    at::Tensor new_var = at::empty({update ? x.size(1) : 0}, vopt);
    auto r = forward_kernels(x, weight, bias, running_mean, running_var, side, training, factor,
                             eps, act, alpha, new_mean, new_var);
    return py::make_tuple(std::get<0>(r), std::get<1>(r), std::get<2>(r), new_mean, new_var);
}

// torch.ops.cfbn.batch_norm_backward's implementation: (dx, dweight, dbias,
// dside, empty without a side input), or None for the bridge.
py::object backward_op(const at::Tensor &grad_out, const at::Tensor &x,
                       const c10::optional<at::Tensor> &weight_,
                       const c10::optional<at::Tensor> &bias_, const at::Tensor &save_mean,
                       const at::Tensor &save_var, bool training, double eps, int act,
                       double alpha, const c10::optional<at::Tensor> &side_)
{
    at::Tensor weight = weight_.value_or(at::Tensor()), bias = bias_.value_or(at::Tensor());
    at::Tensor side = side_.value_or(at::Tensor());
    // the forward's checks, with the saved statistics in the running ones' place
    if (!takes(x, weight, bias, save_mean, save_var, side, true, 0.0, eps, false)
        || !plain_tensor(grad_out) || grad_out.scalar_type() != x.scalar_type()
        || grad_out.sizes() != x.sizes())
        return py::none();
    Options o{training, eps, act, alpha, c10::nullopt, c10::nullopt};
    variable_list g;
    {
        py::gil_scoped_release nogil;
        g = backward_kernels(grad_out, x, weight, bias, side, save_mean, save_var, o);
    }
    if (!g[3].defined())
        g[3] = x.new_empty({0});
    return py::make_tuple(g[0], g[1], g[2], g[3]);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    api = static_cast<const cfbn_c_api *>(PyCapsule_Import(CFBN_C_API_CAPSULE, 0));
    if (api == nullptr)
        throw py::error_already_set();
    if (api->version != CFBN_C_API_VERSION)
        throw std::runtime_error("cfbn.torch: cfbn._kernels exports C API version "
                                 + std::to_string(api->version) + ", this operator needs "
                                 + std::to_string(CFBN_C_API_VERSION));
    m.def("batch_norm", &batch_norm, "cfbn.torch.batch_norm's eager call (None: not taken)");
    m.def("forward_op", &forward_op, "torch.ops.cfbn.batch_norm's kernels (None: not taken)");
    m.def("backward_op", &backward_op,
          "torch.ops.cfbn.batch_norm_backward's kernels (None: not taken)");
    m.def("calls", []() { return py::make_tuple(forward_calls.load(), backward_calls.load()); },
          "(forward, backward) kernel calls made here, for tests");
}
