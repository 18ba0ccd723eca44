// Note [RecordFunction in a debug build]
// LibTorch is built with NDEBUG, and its RecordFunction has a member only where NDEBUG is not defined
// (inputs_valid_, in record_function.h of 1.13 and 2.x alike). A file built without it (the debug and
// sanitizer presets) reads the library's objects with another layout: inputs() and outputs(), inline,
// read the wrong fields, and UBSan stops at the bool it reads (make test-asan, 2026-12-02). This file
// therefore sees LibTorch's headers as the library was built, whatever the build type: NDEBUG before
// any of them, and no precompiled header (src/CMakeLists.txt); Flops.h does not include record_function.h.
#ifndef NDEBUG
#define NDEBUG
#endif
#include "cohort/models/Flops.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include <ATen/record_function.h>

// Note [Counting FLOPs]
// MFU divides achieved FLOP/s by the device's peak, so the FLOPs must be the ones users already quote:
// torch.utils.flop_counter's (Lightning's, torchtitan's, Composer's), not a formula of our own per model.
// That counter sees ATen's operators below autograd and counts matrix products and convolutions; we
// observe the same operators through the dispatcher's RecordFunction, which LibTorch 1.13 and 2.x both
// have, with the same formulas:
//   - mm, addmm: 2 m k n; bmm, baddbmm: 2 b m k n;
//   - convolution: 2 x |output| x |weight[1:]| (|input| for a transposed one);
//   - convolution_backward: that once for each gradient it computes (input, weight).
// An operator counted inside another one (a convolution's im2col mm) is not counted again. Equal to
// flop_counter's count on torchvision's ResNets and timm's ViT-B/32 (tests/reference/flops.py), once the
// attention products flop_counter misses on CPU are added to its figure: timm's fused attention runs
// _scaled_dot_product_flash_attention_for_cpu there, for which torch 2.14's flop_counter has no formula
// (1.06% of ViT-B/32's FLOPs). cohort's ViT multiplies with bmm, which is counted.
// Inputs are read in the start callback, as they are valid only there in 2.x; outputs in the end one.

namespace cohort::models {

namespace {

enum class Op { kMm, kAddmm, kBmm, kBaddbmm, kConv, kConvBackward };

struct Tally {
  std::mutex mu;
  std::map<std::string, double> flops;
};
std::atomic<Tally*> g_tally{nullptr};
thread_local int g_open = 0;  // counted operators open on this thread

struct Open : at::ObserverContext {
  Op op{};
  double flops = 0;  // mm-like: all of it; a convolution: per output element (or input, transposed) and gradient
  bool transposed = false;
  double input_numel = 0, grad_out_numel = 0;
};

bool op_of(const char* name, Op* op) {
  static const std::pair<const char*, Op> kOps[] = {{"aten::mm", Op::kMm},
                                                    {"aten::addmm", Op::kAddmm},
                                                    {"aten::bmm", Op::kBmm},
                                                    {"aten::baddbmm", Op::kBaddbmm},
                                                    {"aten::convolution", Op::kConv},
                                                    {"aten::convolution_backward", Op::kConvBackward}};
  for (const auto& [n, o] : kOps)
    if (std::strcmp(name, n) == 0) return *op = o, true;
  return false;
}

double numel(const c10::IValue& v) { return v.isTensor() ? static_cast<double>(v.toTensor().numel()) : 0.0; }

// |weight[1:]|: in-channels per group times the kernel's size (out-channels per group, transposed).
double per_output(const c10::IValue& weight) {
  const auto s = weight.toTensor().sizes();
  double p = 1;
  for (size_t i = 1; i < s.size(); ++i) p *= static_cast<double>(s[i]);
  return p;
}

double matmul_flops(const c10::IValue& a, const c10::IValue& b) {
  const auto x = a.toTensor().sizes(), y = b.toTensor().sizes();
  double batch = 1;
  for (size_t i = 0; i + 2 < x.size(); ++i) batch *= static_cast<double>(x[i]);
  return 2 * batch * static_cast<double>(x[x.size() - 2]) * static_cast<double>(x.back()) *
         static_cast<double>(y.back());
}

std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
  Op op;
  if (g_open > 0 || !op_of(fn.name(), &op)) return nullptr;
  const auto in = fn.inputs();
  auto open = std::make_unique<Open>();
  open->op = op;
  if (op == Op::kMm || op == Op::kBmm) open->flops = matmul_flops(in[0], in[1]);
  if (op == Op::kAddmm || op == Op::kBaddbmm) open->flops = matmul_flops(in[1], in[2]);
  if (op == Op::kConv) {  // (input, weight, bias, stride, padding, dilation, transposed, ...)
    open->flops = 2 * per_output(in[1]);
    open->transposed = in[6].toBool();
    open->input_numel = numel(in[0]);
  }
  if (op ==
      Op::kConvBackward) {  // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, ...)
    open->flops = 2 * per_output(in[2]);
    open->transposed = in[7].toBool();
    open->input_numel = numel(in[1]);
    open->grad_out_numel = numel(in[0]);
  }
  ++g_open;
  return open;
}

void leave(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!ctx) return;
  --g_open;
  auto* open = static_cast<Open*>(ctx);
  double flops = open->flops;
  const auto out = fn.outputs();
  if (open->op == Op::kConv) flops *= open->transposed ? open->input_numel : (out.empty() ? 0 : numel(out[0]));
  if (open->op == Op::kConvBackward) {
    const double gradients =
        (out.size() > 0 && numel(out[0]) > 0 ? 1 : 0) + (out.size() > 1 && numel(out[1]) > 0 ? 1 : 0);
    flops *= (open->transposed ? open->input_numel : open->grad_out_numel) * gradients;
  }
  Tally* tally = g_tally.load();
  if (!tally) return;
  std::lock_guard<std::mutex> lock(tally->mu);
  tally->flops[fn.name()] += flops;
}

}  // namespace

FlopCounter::FlopCounter() {
  auto tally = std::make_unique<Tally>();
  Tally* none = nullptr;
  if (!g_tally.compare_exchange_strong(none, tally.get())) return;
  tally.release();
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&enter, &leave)
                                      .needsInputs(true)
                                      .needsOutputs(true)
                                      .scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  if (!counting()) return;
  at::removeCallback(handle_);
  delete g_tally.exchange(nullptr);
}

double FlopCounter::total() const {
  if (!counting()) return -1;
  double sum = 0;
  for (const auto& [name, f] : by_op()) sum += f;
  return sum;
}

std::map<std::string, double> FlopCounter::by_op() const {
  if (!counting()) return {};
  Tally* tally = g_tally.load();
  std::lock_guard<std::mutex> lock(tally->mu);
  return tally->flops;
}

}  // namespace cohort::models
