// cfbn's PyTorch operators, registered in the dispatcher from C++ against
// LibTorch's stable ABI (torch/csrc/stable/), so that one binary built with
// TORCH_TARGET_VERSION 2.10 loads in torch 2.10 and every later release:
//
//   cfbn::batch_norm                 the forward; returns the new running
//                                    statistics instead of writing them
//   cfbn::batch_norm_backward        its gradient
//   cfbn::batch_norm_double_backward the gradient of the gradient
//
// The schemas are below; cfbn/torch/ops.py gives them autograd formulas and
// fake (meta) kernels in Python, which the stable ABI leaves to Python.  The
// kernels are cfbn's own: cfbn._kernels exports its driver as a table of C
// functions (c_api.h), whose address the loader (cfbn/torch/_library.py)
// hands to cfbn_torch_bind once, right after loading this library.
//
// The operators take what PyTorch's batch norm takes: CPU tensors of
// float32, float64, float16 or bfloat16 with 2 to 5 dimensions, contiguous
// or channels-last (other strides are read through one copy), per-channel
// tensors of the vector dtype (float64 for float64 input, else float32) or
// of a 16-bit input's own dtype.  The Python layer checks every argument
// first and raises PyTorch's errors; the checks here keep a direct call of
// torch.ops.cfbn.* from reading memory it should not.  Outputs have the input's
// memory format; large ones come from cfbn's output cache (cached_output).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/MemoryFormat.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <new>
#include <optional>
#include <sstream>
#include <tuple>
#include <vector>

#include "c_api.h"
#include "rules.h"  /* the scalar arguments' rules and their words */

// The glibc and libstdc++ this library needs decide the wheels' manylinux
// tag, so it asks for no more than cfbn's C core does (glibc 2.17):
// setup.py builds it with the pre-C++11 std::string ABI and without sized
// deallocation (nothing of libstdc++ crosses the stable C shim, so the
// choice is this library's alone), exports cfbn_torch_bind only
// (torch_ops.map), and these two constructors, which the torch headers'
// error messages use and libstdc++ exports only since GCC 9 (GLIBCXX_3.4.26),
// are instantiated here, private to the library.
template std::basic_stringstream<char>::basic_stringstream();
template std::basic_ostringstream<char>::basic_ostringstream();

// The shim's torch_from_blob (PyTorch 2.11 and later), declared here because
// the headers show it only to a build that targets 2.11: weak, so that on a
// 2.10 libtorch it is null and output() takes PyTorch's allocator instead.
extern "C" __attribute__((weak)) AOTITorchError torch_from_blob(
    void *data, int64_t ndim, const int64_t *sizes_ptr, const int64_t *strides_ptr,
    int64_t storage_offset, int32_t dtype, int32_t device_type, int32_t device_index,
    AtenTensorHandle *ret, int32_t layout, const uint8_t *opaque_metadata,
    int64_t opaque_metadata_size, void (*deleter)(void *data, void *ctx), void *deleter_ctx);

namespace {

using torch::stable::Tensor;
using torch::headeronly::MemoryFormat;
using torch::headeronly::ScalarType;
using OptTensor = std::optional<Tensor>;

const cfbn_c_api *api = nullptr;

enum Kind { FIRST = 0, LAST = 1, OTHER = -1 };

int dtype_code(ScalarType t)
{
    switch (t) {
    case ScalarType::Float: return 0;
    case ScalarType::Double: return 1;
    case ScalarType::Half: return 2;
    case ScalarType::BFloat16: return 3;
    default: return -1;
    }
}

bool half_type(ScalarType t)
{
    return t == ScalarType::Half || t == ScalarType::BFloat16;
}

// The per-channel dtype the kernels take for an input dtype.
ScalarType vector_type(ScalarType t)
{
    return t == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

const int64_t FIRST_ORDER[5] = {0, 1, 2, 3, 4};
const int64_t LAST_ORDER[4][5] = {{0, 1}, {0, 2, 1}, {0, 2, 3, 1}, {0, 2, 3, 4, 1}};

// Whether t is dense with its axes, slowest to fastest, in `order` (size-1
// axes may have any stride, as in PyTorch's own contiguity flags).
bool dense_in_order(const Tensor &t, const int64_t *order, int64_t nd)
{
    int64_t expected = 1;
    for (int64_t i = nd - 1; i >= 0; --i) {
        int64_t d = order[i], size = t.size(d);
        if (size != 1) {
            if (t.stride(d) != expected)
                return false;
            expected *= size;
        }
    }
    return true;
}

// Contiguous first (a contiguous (N, C) counts as channels last), then
// channels last: (N, L, C) memory for 3-D, channels_last(_3d) for 4-D and 5-D.
Kind layout_kind(const Tensor &t)
{
    int64_t nd = t.dim();
    if (dense_in_order(t, FIRST_ORDER, nd))
        return nd == 2 ? LAST : FIRST;
    if (dense_in_order(t, LAST_ORDER[nd - 2], nd))
        return LAST;
    return OTHER;
}

// t laid out as `kind`: itself, or one copy.
Tensor in_layout(const Tensor &t, Kind kind)
{
    if (t.numel() == 0 || layout_kind(t) == kind)
        return t;
    int64_t nd = t.dim();
    if (kind == FIRST || nd == 2)
        return torch::stable::contiguous(t);
    if (nd == 3) {
        Tensor c = torch::stable::contiguous(torch::stable::transpose(t, 1, 2));
        return torch::stable::transpose(c, 1, 2);
    }
    return torch::stable::contiguous(t, nd == 4 ? MemoryFormat::ChannelsLast
                                                : MemoryFormat::ChannelsLast3d);
}

// aten::empty_strided, which the stable ops header does not wrap.
Tensor empty_strided(const std::vector<int64_t> &sizes, const std::vector<int64_t> &strides,
                     ScalarType dtype, torch::stable::Device device)
{
    torch::headeronly::IntHeaderOnlyArrayRef size_ref(sizes), stride_ref(strides);
    std::array<StableIValue, 6> stack{
        torch::stable::detail::from(size_ref), torch::stable::detail::from(stride_ref),
        torch::stable::detail::from(std::optional<ScalarType>(dtype)),
        torch::stable::detail::from(std::optional<torch::headeronly::Layout>()),
        torch::stable::detail::from(std::optional<torch::stable::Device>(device)),
        torch::stable::detail::from(std::optional<bool>())};
    STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::empty_strided", "", stack.data(),
                                                        TORCH_ABI_VERSION));
    return torch::stable::detail::to<Tensor>(stack[0]);
}

// A large output's buffer goes back to cfbn's output cache when its tensor's
// storage dies (ctx: the buffer's size).
void release_output(void *data, void *ctx)
{
    api->output_free(data, reinterpret_cast<size_t>(ctx));
}

// Cleared by a failed torch_from_blob: each failure builds a c10::Error with
// its backtrace (symbolizing it took 40% of a (8,64,56,56) step), so one is
// enough to fall back for good.
std::atomic<bool> blob_outputs{true};

// A tensor over a buffer of cfbn's output cache (out_cache.h), or an
// undefined one where the cache does not take the size.  Outputs from
// PyTorch's allocator are fresh memory on most calls: glibc unmaps or trims
// a large freed block, and the next one is faulted in and zeroed by the
// kernel while the kernels write it (a (8,64,56,56) float32 step: about
// 1,200 faults, a third of its time); the cache hands the last freed buffer
// of the size back, as it does for the NumPy calls' outputs.  The shim's
// torch_from_blob with a deleter is PyTorch 2.11's; on 2.10 (the library's
// floor) it is absent and outputs come from PyTorch's allocator.
Tensor cached_output(const std::vector<int64_t> &sizes, const std::vector<int64_t> &strides,
                     const Tensor &like, size_t nbytes)
{
    if (torch_from_blob == nullptr || !like.is_cpu()
        || !blob_outputs.load(std::memory_order_relaxed))
        return Tensor();
    void *p = api->output_alloc(nbytes);
    if (p == nullptr)
        return Tensor();
    namespace d = torch::stable::detail;
    AtenTensorHandle h = nullptr;
    AOTITorchError err = torch_from_blob(
        p, (int64_t)sizes.size(), sizes.data(), strides.data(), 0,
        d::to<int32_t>(d::from(like.scalar_type())),
        // device index -1: the CPU device as for_blob infers it from the
        // pointer (cpu:0 would not match it, an error)
        d::to<int32_t>(d::from(torch::headeronly::DeviceType::CPU)), -1, &h,
        d::to<int32_t>(d::from(torch::headeronly::Layout::Strided)), nullptr, 0, release_output,
        reinterpret_cast<void *>(nbytes));
    if (err != AOTI_TORCH_SUCCESS) {
        blob_outputs.store(false, std::memory_order_relaxed);
        api->output_free(p, nbytes);
        return Tensor();
    }
    return Tensor(h);
}

// An uninitialized tensor of like's shape and dtype, laid out as `kind`: a
// tensor of its own, never a view (autograd refuses to let a caller modify a
// custom function's view output in place, as nn.ReLU(inplace=True) does).
Tensor output(const Tensor &like, Kind kind)
{
    int64_t nd = like.dim();
    std::vector<int64_t> sizes(like.sizes().begin(), like.sizes().end()), strides(nd);
    const int64_t *order = kind == FIRST || nd == 2 ? FIRST_ORDER : LAST_ORDER[nd - 2];
    int64_t expected = 1;
    for (int64_t i = nd - 1; i >= 0; --i) {
        strides[order[i]] = expected;
        expected *= sizes[order[i]];
    }
    size_t nbytes = (size_t)expected * (like.scalar_type() == ScalarType::Double ? 8
                                        : like.scalar_type() == ScalarType::Float ? 4 : 2);
    if (expected > 0) {
        Tensor t = cached_output(sizes, strides, like, nbytes);
        if (t.defined())
            return t;
    }
    return empty_strided(sizes, strides, like.scalar_type(), like.device());
}

Tensor vector_out(const Tensor &x, ScalarType vdt)
{
    return torch::stable::empty({x.size(1)}, vdt, std::nullopt, x.device());
}

Tensor filled(const Tensor &x, ScalarType vdt, int64_t length, double value)
{
    Tensor t = torch::stable::empty({length}, vdt, std::nullopt, x.device());
    torch::stable::fill_(t, value);
    return t;
}

void check_api()
{
    STD_TORCH_CHECK(api != nullptr, "cfbn: the operators were loaded without cfbn's kernels "
                                    "(import cfbn.torch to use them)");
}

// A shape and a dtype as the Python checks (cfbn/torch/_checks.py) print
// them, so that a refusal reads the same from every entrance: (4, 3) and
// (3,), torch.float32.
std::string shape_text(const Tensor &t)
{
    std::ostringstream out;
    out << "(";
    for (int64_t d = 0; d < t.dim(); ++d)
        out << (d ? ", " : "") << t.size(d);
    out << (t.dim() == 1 ? ",)" : ")");
    return out.str();
}

const char *dtype_text(ScalarType t)
{
    switch (t) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Bool: return "torch.bool";
    default: return "another dtype";
    }
}

void check_input(const Tensor &x, const char *op)
{
    STD_TORCH_CHECK(x.is_cpu(), op, ": input: expected a CPU tensor");
    STD_TORCH_CHECK(dtype_code(x.scalar_type()) >= 0, op,
                    ": input: expected float32, float64, float16 or bfloat16");
    STD_TORCH_CHECK(x.dim() >= 2 && x.dim() <= 5, op,
                    ": input: expected 2 to 5 dimensions (N, C, ...), got ", x.dim());
}

// A per-channel tensor as the kernels read it: contiguous, of dtype vdt (a
// 16-bit input's own dtype is converted, as PyTorch's CPU kernels accept it).
OptTensor vector_in(const OptTensor &v, const Tensor &x, ScalarType vdt, const char *op,
                    const char *name)
{
    if (!v.has_value() || !v->defined())
        return std::nullopt;
    const Tensor &t = *v;
    STD_TORCH_CHECK(t.is_cpu(), op, ": ", name, ": expected a tensor on the input's device cpu");
    STD_TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(1), op, ": ", name, ": expected ",
                    x.size(1), " values, one per channel of input of shape ", shape_text(x),
                    ", got shape ", shape_text(t));
    ScalarType dt = t.scalar_type(), xdt = x.scalar_type();
    // PyTorch's own words for this (cfbn/torch/_bridge.py's mixed_dtype)
    STD_TORCH_CHECK(dt == vdt || (dt == xdt && half_type(dt)), op, ": mixed dtype (CPU): ", name,
                    ": expected ",
                    half_type(xdt) ? std::string("float32 or ") + dtype_text(xdt) + " for "
                                         + dtype_text(xdt) + " input"
                                   : std::string(dtype_text(vdt)) + " to match the input",
                    ", got ", dtype_text(dt));
    Tensor r = dt == vdt ? t : torch::stable::to(t, vdt);
    return r.is_contiguous() ? r : torch::stable::contiguous(r);
}

// The scalar arguments, by cfbn's rules (rules.h), in the words of
// cfbn._args (the C API checks none of them): eps, which every operator
// takes, and with it the activation code and its alpha (check_scalars).
void check_eps(double eps, const char *op)
{
    STD_TORCH_CHECK(cfbn_epsilon_ok(eps), op, ": eps: expected " CFBN_EXPECT_EPSILON ", got ",
                    eps);
}

void check_scalars(double eps, int64_t activation, double alpha, const char *op)
{
    check_eps(eps, op);
    STD_TORCH_CHECK(cfbn_activation_ok(activation), op,
                    ": activation: expected " CFBN_EXPECT_ACTIVATION ", got ", activation);
    STD_TORCH_CHECK(cfbn_finite_ok(alpha), op, ": alpha: expected " CFBN_EXPECT_FINITE ", got ",
                    alpha);
}

// Another tensor of x's shape and dtype (side input, gradients), laid out as `kind`.
OptTensor like_input(const OptTensor &t, const Tensor &x, Kind kind, const char *op,
                     const char *name)
{
    if (!t.has_value() || !t->defined())
        return std::nullopt;
    STD_TORCH_CHECK(t->is_cpu(), op, ": ", name, ": expected a tensor on the input's device cpu");
    bool same = t->dim() == x.dim();
    for (int64_t d = 0; same && d < x.dim(); ++d)
        same = t->size(d) == x.size(d);
    STD_TORCH_CHECK(same, op, ": ", name, ": expected the input's shape ", shape_text(x), ", got ",
                    shape_text(*t));
    STD_TORCH_CHECK(t->scalar_type() == x.scalar_type(), op, ": ", name,
                    ": expected the input's dtype ", dtype_text(x.scalar_type()), ", got ",
                    dtype_text(t->scalar_type()));
    return in_layout(*t, kind);
}

const void *ptr(const OptTensor &t)
{
    return t.has_value() ? t->const_data_ptr() : nullptr;
}

void check_rc(int rc)
{
    if (rc != 0)
        throw std::bad_alloc();
}

// The tensor's shape as cfbn's driver sees it in layout `kind`.
struct Shape {
    int dtype, layout;
    int64_t outer, channels, inner;
    int threads;
};

Shape shape_of(const Tensor &x, Kind kind)
{
    // enum cfbn_layout: 0 channels last, 1 channels first
    // torch.set_num_threads is honoured: the kernels run on as many threads
    // as PyTorch's own would (their results do not depend on the count).
    Shape s{dtype_code(x.scalar_type()), kind == FIRST ? 1 : 0, 0, x.size(1), 1,
            (int)torch::stable::get_num_threads()};
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

// x as the kernels read it, and its layout in `kind`.
Tensor readable(const Tensor &x, Kind &kind)
{
    kind = layout_kind(x);
    if (kind != OTHER)
        return x;
    kind = FIRST;
    return torch::stable::contiguous(x);
}

// The weight of this batch in the running statistics: momentum, or the
// cumulative average's 1 / num_batches_tracked (0 without a count).
double factor_of(std::optional<double> momentum, const OptTensor &count)
{
    if (momentum.has_value())
        return *momentum;
    if (!count.has_value() || !count->defined())
        return 0.0;
    STD_TORCH_CHECK(count->is_cpu() && count->numel() == 1
                        && count->scalar_type() == ScalarType::Long,
                    "cfbn::batch_norm: num_batches_tracked: expected one int64 on the CPU");
    int64_t n = *static_cast<const int64_t *>(count->const_data_ptr());
    // momentum None weighs the batch by 1 / num_batches_tracked
    STD_TORCH_CHECK(cfbn_count_ok(n), "cfbn::batch_norm: num_batches_tracked: expected "
                    CFBN_EXPECT_COUNT ", got ", n);
    return n == 0 ? 0.0 : 1.0 / (double)n;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> batch_norm(
    Tensor input, OptTensor weight, OptTensor bias, OptTensor running_mean,
    OptTensor running_var, OptTensor num_batches_tracked, bool training,
    std::optional<double> momentum, double eps, int64_t activation, double alpha,
    OptTensor side_input)
{
    const char *op = "cfbn::batch_norm";
    check_api();
    check_input(input, op);
    Kind kind;
    Tensor x = readable(input, kind);
    ScalarType vdt = vector_type(x.scalar_type());
    int64_t channels = x.size(1);
    OptTensor scale = vector_in(weight, x, vdt, op, "weight");
    OptTensor offset = vector_in(bias, x, vdt, op, "bias");
    OptTensor mean = vector_in(running_mean, x, vdt, op, "running_mean");
    OptTensor var = vector_in(running_var, x, vdt, op, "running_var");
    STD_TORCH_CHECK(mean.has_value() == var.has_value(), op,
                    ": running_mean, running_var: pass both or neither (got ",
                    mean.has_value() ? "running_var" : "running_mean", " None)");
    STD_TORCH_CHECK(training || mean.has_value(), op,
                    ": running_mean, running_var: required when training is False");
    check_scalars(eps, activation, alpha, op);
    STD_TORCH_CHECK(!momentum.has_value() || cfbn_finite_ok(*momentum), op,
                    ": momentum: expected " CFBN_EXPECT_FINITE ", got ", momentum.value_or(0.0));
    OptTensor side = like_input(side_input, x, kind, op, "side_input");
    bool update = training && mean.has_value();
    double factor = update ? factor_of(momentum, num_batches_tracked) : 0.0;

    Tensor y = output(x, kind);
    Tensor save_mean = vector_out(x, vdt), save_var = vector_out(x, vdt);
    Tensor new_mean = torch::stable::empty({update ? channels : 0}, vdt, std::nullopt, x.device());
    Tensor new_var = torch::stable::empty({update ? channels : 0}, vdt, std::nullopt, x.device());
    if (x.numel() == 0) {
        // PyTorch's batch norm of an empty batch: an empty output, the
        // running statistics unchanged.
        torch::stable::fill_(save_mean, 0.0);
        torch::stable::fill_(save_var, 1.0);
        if (update) {
            torch::stable::copy_(new_mean, *mean);
            torch::stable::copy_(new_var, *var);
        }
        return {y, save_mean, save_var, new_mean, new_var};
    }
    if (!scale.has_value())
        scale = filled(x, vdt, channels, 1.0);
    if (!offset.has_value())
        offset = filled(x, vdt, channels, 0.0);
    Shape s = shape_of(x, kind);
    int rc;
    if (!training) {
        rc = api->forward_inference(s.dtype, s.layout, s.outer, s.channels, s.inner, s.threads,
                                    x.const_data_ptr(), ptr(scale), ptr(offset), ptr(mean),
                                    ptr(var), eps, y.mutable_data_ptr(),
                                    save_mean.mutable_data_ptr(), save_var.mutable_data_ptr(),
                                    (int)activation, alpha, ptr(side));
    } else {
        // Without running statistics none are read or written (factor 1);
        // with factor 1 the old ones are not read (TensorFlow's rule, which
        // cfbn's kernels follow).
        double f = update ? factor : 1.0;
        bool read = update && f != 1.0;
        rc = api->forward_training(s.dtype, s.layout, s.outer, s.channels, s.inner, s.threads,
                                   x.const_data_ptr(), ptr(scale), ptr(offset),
                                   read ? ptr(mean) : nullptr, read ? ptr(var) : nullptr, eps, f,
                                   y.mutable_data_ptr(),
                                   update ? new_mean.mutable_data_ptr() : nullptr,
                                   update ? new_var.mutable_data_ptr() : nullptr,
                                   save_mean.mutable_data_ptr(), save_var.mutable_data_ptr(),
                                   (int)activation, alpha, ptr(side));
    }
    check_rc(rc);
    return {y, save_mean, save_var, new_mean, new_var};
}

// A per-channel gradient in the parameter's dtype (the vector dtype without one).
Tensor grad_vector(const Tensor &g, const OptTensor &param)
{
    if (!param.has_value() || !param->defined() || param->scalar_type() == g.scalar_type())
        return g;
    return torch::stable::to(g, param->scalar_type());
}

// The saved statistics: vectors of the input's vector dtype, as the kernels
// read them (contiguous).
Tensor saved_in(const Tensor &t, const Tensor &x, ScalarType vdt, const char *op,
                const char *name)
{
    STD_TORCH_CHECK(t.scalar_type() == vdt, op, ": ", name,
                    ": expected the forward's statistics, a tensor of dtype ", dtype_text(vdt),
                    ", got ", dtype_text(t.scalar_type()));
    return *vector_in(t, x, vdt, op, name);
}

// What both gradients read first: the input as the kernels read it, its
// layout and vector dtype, the forward's statistics, the scale (ones
// without a weight) and the upstream gradient in the input's layout.
struct GradInputs {
    Tensor x;
    Kind kind;
    ScalarType vdt;
    Tensor scale;
    Tensor mean, var;
    OptTensor dy;
};

GradInputs grad_inputs(const Tensor &input, const Tensor &grad_out, const OptTensor &weight,
                       const Tensor &save_mean, const Tensor &save_var, const char *op)
{
    check_api();
    check_input(input, op);
    GradInputs g;
    g.x = readable(input, g.kind);
    g.vdt = vector_type(g.x.scalar_type());
    g.mean = saved_in(save_mean, g.x, g.vdt, op, "save_mean");
    g.var = saved_in(save_var, g.x, g.vdt, op, "save_var");
    OptTensor scale = vector_in(weight, g.x, g.vdt, op, "weight");
    g.scale = scale.has_value() ? *scale : filled(g.x, g.vdt, g.x.size(1), 1.0);
    g.dy = like_input(grad_out, g.x, g.kind, op, "grad_out");
    return g;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward(
    Tensor grad_out, Tensor input, OptTensor weight, OptTensor bias, Tensor save_mean,
    Tensor save_var, bool training, double eps, int64_t activation, double alpha,
    OptTensor side_input)
{
    const char *op = "cfbn::batch_norm_backward";
    GradInputs g = grad_inputs(input, grad_out, weight, save_mean, save_var, op);
    const Tensor &x = g.x;
    Kind kind = g.kind;
    ScalarType vdt = g.vdt;
    OptTensor offset = vector_in(bias, x, vdt, op, "bias");
    check_scalars(eps, activation, alpha, op);
    OptTensor side = like_input(side_input, x, kind, op, "side_input");
    Tensor dx = output(x, kind);
    Tensor dside = side.has_value() ? output(x, kind)
                                    : torch::stable::empty({0}, x.scalar_type(), std::nullopt,
                                                           x.device());
    Tensor dscale = vector_out(x, vdt), doffset = vector_out(x, vdt);
    if (x.numel() == 0) {
        torch::stable::fill_(dscale, 0.0);
        torch::stable::fill_(doffset, 0.0);
        return {dx, grad_vector(dscale, weight), grad_vector(doffset, bias), dside};
    }
    if (activation != 0 && !offset.has_value())
        offset = filled(x, vdt, x.size(1), 0.0);
    Shape s = shape_of(x, kind);
    int rc = api->backward(s.dtype, s.layout, s.outer, s.channels, s.inner, s.threads,
                           training, ptr(g.dy), x.const_data_ptr(), g.scale.const_data_ptr(),
                           g.mean.const_data_ptr(), g.var.const_data_ptr(), eps,
                           dx.mutable_data_ptr(), dscale.mutable_data_ptr(),
                           doffset.mutable_data_ptr(),
                           (int)activation, alpha, ptr(side),
                           activation != 0 ? ptr(offset) : nullptr,
                           side.has_value() ? dside.mutable_data_ptr() : nullptr);
    check_rc(rc);
    return {dx, grad_vector(dscale, weight), grad_vector(doffset, bias), dside};
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_double_backward(
    Tensor grad_out, Tensor input, OptTensor weight, Tensor save_mean, Tensor save_var,
    OptTensor grad_grad_input, OptTensor grad_grad_weight, OptTensor grad_grad_bias,
    bool training, double eps)
{
    const char *op = "cfbn::batch_norm_double_backward";
    GradInputs g = grad_inputs(input, grad_out, weight, save_mean, save_var, op);
    check_eps(eps, op);
    const Tensor &x = g.x;
    Kind kind = g.kind;
    ScalarType vdt = g.vdt;
    OptTensor ggx = like_input(grad_grad_input, x, kind, op, "grad_grad_input");
    // the upstream gradients of the parameter gradients take the
    // parameters' own dtypes (vector_in's rule), never a cast from another
    OptTensor ggs = vector_in(grad_grad_weight, x, vdt, op, "grad_grad_weight");
    OptTensor ggo = vector_in(grad_grad_bias, x, vdt, op, "grad_grad_bias");
    Tensor ddy = output(x, kind), dx = output(x, kind), dscale = vector_out(x, vdt);
    if (x.numel() == 0) {
        torch::stable::fill_(dscale, 0.0);
        return {ddy, dx, grad_vector(dscale, weight)};
    }
    Shape s = shape_of(x, kind);
    int rc = api->backward_backward(s.dtype, s.layout, s.outer, s.channels, s.inner,
                                    s.threads, training, ptr(g.dy), x.const_data_ptr(),
                                    g.scale.const_data_ptr(), g.mean.const_data_ptr(),
                                    g.var.const_data_ptr(), eps, ptr(ggx), ptr(ggs),
                                    ptr(ggo), ddy.mutable_data_ptr(), dx.mutable_data_ptr(),
                                    dscale.mutable_data_ptr());
    check_rc(rc);
    return {ddy, dx, grad_vector(dscale, weight)};
}

}  // namespace

// libstdc++'s reference counts (std::shared_ptr, which torch::stable::Tensor
// holds) read glibc 2.32's __libc_single_threaded where the headers have it,
// and that one symbol would raise the wheels' glibc floor to 2.32 (see the
// top of this file).
// A private copy saying "not single-threaded" keeps the atomic counts always:
// the same results, and the library loads on any glibc torch itself runs on.
extern "C" {
char __libc_single_threaded = 0;
}

// The driver's parallel loops on PyTorch's intra-op pool: the tasks cfbn's
// plan made for torch.get_num_threads() threads, run by at::parallel_for's
// threads instead of a second OpenMP runtime's (a wheel vendors its own
// libgomp beside the one torch ships, and the idle threads of each spin
// while the other works).
void run_on_torch_pool(int64_t tasks, cfbn_c_api_task_fn task, void *ctx)
{
    torch::stable::parallel_for(0, tasks, 1, [task, ctx](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
            task(ctx, t);
    });
}

// The loader's one call after loading: cfbn._kernels' table of C functions
// (its capsule "cfbn._kernels.c_api"), and whether its parallel loops run
// on PyTorch's pool (else cfbn's OpenMP threads).  Returns the table
// version this library needs when the table is another version, else 0.
extern "C" __attribute__((visibility("default"))) int cfbn_torch_bind(const void *table,
                                                                      int torch_pool)
{
    const cfbn_c_api *t = static_cast<const cfbn_c_api *>(table);
    if (t == nullptr || t->version != CFBN_C_API_VERSION)
        return CFBN_C_API_VERSION;
    api = t;
    api->set_runner(torch_pool ? run_on_torch_pool : nullptr);
    return 0;
}

STABLE_TORCH_LIBRARY(cfbn, m)
{
    m.def("batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
          "Tensor? running_var, Tensor? num_batches_tracked, bool training, float? momentum, "
          "float eps, int activation, float alpha, Tensor? side_input) "
          "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? bias, "
          "Tensor save_mean, Tensor save_var, bool training, float eps, int activation, "
          "float alpha, Tensor? side_input) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("batch_norm_double_backward(Tensor grad_out, Tensor input, Tensor? weight, "
          "Tensor save_mean, Tensor save_var, Tensor? grad_grad_input, Tensor? grad_grad_weight, "
          "Tensor? grad_grad_bias, bool training, float eps) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cfbn, CPU, m)
{
    m.impl("batch_norm", TORCH_BOX(&batch_norm));
    m.impl("batch_norm_backward", TORCH_BOX(&batch_norm_backward));
    m.impl("batch_norm_double_backward", TORCH_BOX(&batch_norm_double_backward));
}
