// cohort's training step on one device, timed on synthetic data: the C++ side of bench/gpu_compare.py,
// whose peer is bench/peers/torch_train_step.py (same arguments, same JSON keys; read its docstring for
// what a step is). It uses the library's own pieces: models::build, optim::Sgd, amp::MixedPrecision
// (autocast, loss scaling), amp::MasterWeights (fp16-master) and amp::unscale_and_check. It calls them
// without a Strategy: a strategy needs a communicator, pip's LibTorch may have no Gloo, and at world size
// 1 the ddp strategy's step is this same sequence.
//
//   build-gpu/bench/gpu_train_step --model resnet50 --batch 256 --precision bf16 --channels-last --steps 50
//   build/bench/gpu_train_step --device cpu --model resnet18 --batch 4 --image 64 --steps 2   # CPU smoke run
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/record_function.h>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cohort/amp/MasterWeights.h"
#include "cohort/amp/MixedPrecision.h"
#include "cohort/models/Loss.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/train/Device.h"
#include "cohort/util/Error.h"

#if COHORT_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "resnet50", precision = "fp32", device = "cuda", foreach = "auto";
  int64_t batch = 0, image = 0, classes = 0, steps = 50, warmup = 10, epochs = 0, dataset_size = 50000;
  bool channels_last = false, cuda_graph = false, phases = false, count_ops = false;
};

// --count-ops: ATen operator calls in the timed steps, seen through the dispatcher's RecordFunction as
// PyTorch's profiler sees them (autograd's nodes and user scopes are not operators), per step and by
// name. Two counts: every call, nested ones included (an operator that calls another, as mul_ calls
// mul.out in 1.13, counts twice); and the top-level calls, those not made inside another operator: what
// the program and autograd's nodes ask for. The peer counts its profiler's "aten::" events alike.
class OpCount {
 public:
  void start() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OpCount::enter, &OpCount::leave)
                                        .needsInputs(false)
                                        .scopes({at::RecordScope::FUNCTION}));
  }
  void stop() { at::removeCallback(handle_); }
  nlohmann::json report(int64_t steps) const {
    std::lock_guard<std::mutex> lock(tally().mutex);
    const double per = 1.0 / static_cast<double>(steps);
    nlohmann::json all, top;
    double n_all = 0, n_top = 0;
    for (const auto& [name, n] : tally().all) all[name] = n * per, n_all += n * per;
    for (const auto& [name, n] : tally().top) top[name] = n * per, n_top += n * per;
    return {{"ops_per_step", n_all},
            {"top_level_ops_per_step", n_top},
            {"distinct_ops", tally().all.size()},
            {"ops_per_step_by_name", all},
            {"top_level_ops_per_step_by_name", top}};
  }

 private:
  struct Tally {
    std::mutex mutex;
    std::map<std::string, int64_t> all, top;
  };
  static Tally& tally() {
    static Tally t;
    return t;
  }
  static int& depth() {  // ATen calls open on this thread
    thread_local int d = 0;
    return d;
  }
  static bool aten(const at::RecordFunction& fn) { return std::string(fn.name()).rfind("aten::", 0) == 0; }
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    if (!aten(fn)) return nullptr;
    std::lock_guard<std::mutex> lock(tally().mutex);
    ++tally().all[fn.name()];
    if (depth()++ == 0) ++tally().top[fn.name()];
    return nullptr;
  }
  static void leave(const at::RecordFunction& fn, at::ObserverContext*) {
    if (aten(fn)) --depth();
  }
  at::CallbackHandle handle_ = 0;
};

void sync(const c10::Device& d) {
#if COHORT_HAVE_CUDA
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
#endif
}

// --phases: the device is synchronized after each part of a step and the time since the last mark is
// added to that part, so a gap between cohort and the peer can be placed (forward, backward, unscale,
// optimizer, zero_grad). The syncs cost time themselves: these runs are not the images/s runs.
struct PhaseTimer {
  bool on = false;
  c10::Device device{c10::kCPU};
  Clock::time_point last;
  std::map<std::string, double> seconds;
  void start() {
    if (!on) return;
    sync(device);
    last = Clock::now();
  }
  void mark(const char* phase) {
    if (!on) return;
    sync(device);
    const auto now = Clock::now();
    seconds[phase] += std::chrono::duration<double>(now - last).count();
    last = now;
  }
};

// One training step of the peer's definition, on `x`, `y` already on the device.
struct Stepper {
  std::shared_ptr<cohort::models::Classifier> model;
  cohort::amp::MixedPrecision& mp;
  cohort::amp::MasterWeights masters;
  std::unique_ptr<cohort::optim::Optimizer> opt;
  double smoothing;
  PhaseTimer phases;

  at::Tensor forward_backward(const at::Tensor& x, const at::Tensor& y) {
    phases.start();
    at::Tensor logits;
    {
      auto autocast = mp.autocast();
      logits = mp.logits(model->forward(mp.input(x)));
    }
    auto loss = cohort::models::training_loss(logits, y, {smoothing});
    phases.mark("forward");
    mp.scale(loss).backward();
    phases.mark("backward");
    return loss;
  }
  void update() {
    masters.grads_to_master();
    std::vector<at::Tensor> grads;
    for (const auto& g : opt->groups())
      for (const auto& p : g.params) grads.push_back(p.grad());
    const bool overflow = mp.scaling() && cohort::amp::unscale_and_check(grads, 1.0 / mp.loss_scale());
    phases.mark("unscale");
    if (!overflow) {
      opt->step(0.01);
      masters.master_to_model();
    }
    mp.after_step(overflow, 0);
    phases.mark("optimizer");
    opt->zero_grad();
    masters.zero_model_grads();
    phases.mark("zero_grad");
  }
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"cohort's training step on synthetic data (peer: bench/peers/torch_train_step.py)"};
  app.add_option("--model", a.model)->check(CLI::IsMember({"resnet50", "resnet18", "vit_b32", "airbench94"}));
  app.add_option("--batch", a.batch, "default: 256, airbench94 1024");
  app.add_option("--image", a.image, "default: 224, airbench94 32");
  app.add_option("--classes", a.classes, "default: 1000, airbench94 10");
  app.add_option("--precision", a.precision)->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp16-master"}));
  app.add_flag("--channels-last", a.channels_last);
  app.add_option("--steps", a.steps);
  app.add_option("--warmup", a.warmup);
  app.add_option("--epochs", a.epochs, "airbench94: time this many whole epochs instead");
  app.add_option("--dataset-size", a.dataset_size);
  app.add_option("--device", a.device)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_flag("--cuda-graph", a.cuda_graph, "capture forward and backward in a CUDA graph (fp32, bf16)");
  app.add_option("--foreach", a.foreach, "optim.foreach: multi-tensor SGD (auto: on for CUDA)")
      ->check(CLI::IsMember({"auto", "true", "false"}));
  app.add_flag("--phases", a.phases, "time forward, backward, unscale, optimizer and zero_grad apart (syncs)");
  app.add_flag("--count-ops", a.count_ops,
               "count ATen operator calls per timed step (slows the step: not for images/s)");
  CLI11_PARSE(app, argc, argv);
  const bool airbench = a.model == "airbench94";
  if (!a.batch) a.batch = airbench ? 1024 : 256;
  if (!a.image) a.image = airbench ? 32 : 224;
  if (!a.classes) a.classes = airbench ? 10 : 1000;
  try {
    const c10::Device device = cohort::train::training_device(a.device, 0);
    cohort::train::configure_device(device, /*cudnn_benchmark=*/true);
    cohort::ModelConfig mc;
    mc.name = airbench ? "airbench" : a.model;
    mc.num_classes = a.classes;
    torch::manual_seed(0);
    auto model = cohort::models::build(mc, 3, a.image);
    model->to(device);
    if (a.channels_last) cohort::train::to_channels_last(*model);
    cohort::AmpConfig ac;
    ac.precision = a.precision;
    cohort::amp::MixedPrecision mp(ac, device, /*lead=*/false);
    mp.prepare_model(*model);
    cohort::OptimConfig oc;
    oc.lr = 0.01, oc.momentum = 0.9, oc.nesterov = true, oc.weight_decay = 5e-4, oc.decay_norm_and_bias = true;
    oc.foreach = a.foreach;
    cohort::amp::MasterWeights masters(model->named_parameters());
    auto opt = cohort::optim::make_optimizer(
        oc, cohort::optim::split_groups(masters.optimizer_params(), {oc.weight_decay, true, 1.0}));
    const bool foreach = cohort::optim::use_foreach(a.foreach, opt->groups());
    Stepper step{model, mp, std::move(masters), std::move(opt), airbench ? 0.2 : 0.1, PhaseTimer{}};
    const auto f32 = at::TensorOptions().device(device);
    auto prep = [&](at::Tensor x) { return cohort::train::images_to(x, device, a.channels_last); };

    bool graph_used = false;
    OpCount ops;
    std::string note;
    double seconds = 0;
    int64_t timed_steps = 0;
    if (airbench && a.epochs > 0) {
      auto data = torch::randint(0, 256, {a.dataset_size, 3, a.image, a.image}, f32.dtype(at::kByte));
      auto labels = torch::randint(0, a.classes, {a.dataset_size}, f32.dtype(at::kLong));
      auto mean = torch::tensor({0.4914, 0.4822, 0.4465}, f32).view({1, 3, 1, 1});
      auto stdv = torch::tensor({0.2470, 0.2435, 0.2616}, f32).view({1, 3, 1, 1});
      auto batch_of = [&](const at::Tensor& idx) {
        auto x = (data.index_select(0, idx).to(at::kFloat) / 255.0 - mean) / stdv;
        auto flip = torch::rand({idx.size(0), 1, 1, 1}, f32) < 0.5;
        return std::make_pair(prep(torch::where(flip, x.flip({3}), x)), labels.index_select(0, idx));
      };
      const int64_t per_epoch = a.dataset_size / a.batch;
      auto perm = torch::randperm(a.dataset_size, f32.dtype(at::kLong));
      for (int64_t w = 0; w < a.warmup; ++w) {
        auto [x, y] = batch_of(perm.narrow(0, (w % per_epoch) * a.batch, a.batch));
        step.forward_backward(x, y);
        step.update();
      }
      sync(device);
      if (a.count_ops) ops.start();
      const auto t0 = Clock::now();
      for (int64_t e = 0; e < a.epochs; ++e) {
        perm = torch::randperm(a.dataset_size, f32.dtype(at::kLong));
        for (int64_t b = 0; b < per_epoch; ++b) {
          auto [x, y] = batch_of(perm.narrow(0, b * a.batch, a.batch));
          step.forward_backward(x, y);
          step.update();
          ++timed_steps;
        }
      }
      sync(device);
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    } else {
      auto x = prep(torch::randn({a.batch, 3, a.image, a.image}, f32));
      auto y = torch::randint(0, a.classes, {a.batch}, f32.dtype(at::kLong));
      std::function<void()> run_step = [&] {
        step.forward_backward(x, y);
        step.update();
      };
#if COHORT_HAVE_CUDA
      // Forward and backward captured once and replayed; the optimizer stays eager (cohort's optimizers
      // read a scalar on the host, which capture forbids). Autocast's weight cache must be off in capture.
      std::shared_ptr<at::cuda::CUDAGraph> graph;
      if (a.cuda_graph && device.is_cuda() && !mp.scaling()) {
        auto side = c10::cuda::getStreamFromPool(false, device.index());
        {
          c10::cuda::CUDAStreamGuard guard(side);
          for (int i = 0; i < 3; ++i) run_step();
        }
        sync(device);
        for (auto& p : model->parameters()) p.mutable_grad() = at::zeros_like(p);  // static gradient buffers
        at::autocast::set_autocast_cache_enabled(false);
        graph = std::make_shared<at::cuda::CUDAGraph>();
        {
          c10::cuda::CUDAStreamGuard guard(side);
          graph->capture_begin();
          step.forward_backward(x, y);
          graph->capture_end();
        }
        sync(device);
        run_step = [&] {
          graph->replay();
          step.masters.grads_to_master();
          step.opt->step(0.01);
          step.masters.master_to_model();
          // Gradients stay allocated (the graph writes them), zeroed for the next replay's accumulation.
          for (auto& p : model->parameters()) p.grad().zero_();
        };
        graph_used = true;
      } else if (a.cuda_graph) {
        note = "--cuda-graph skipped: needs --device cuda and no loss scaling (fp32 or bf16)";
      }
#else
      if (a.cuda_graph) note = "--cuda-graph skipped: this build has no CUDA";
#endif
      for (int64_t w = 0; w < a.warmup; ++w) run_step();
      step.phases = PhaseTimer{a.phases && !graph_used, device, {}, {}};
      if (a.phases && graph_used) note = "--phases skipped: the step is a graph replay";
      sync(device);
      if (a.count_ops) ops.start();
      const auto t0 = Clock::now();
      for (int64_t s = 0; s < a.steps; ++s) run_step();
      sync(device);
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      timed_steps = a.steps;
    }
    if (a.count_ops) ops.stop();
    nlohmann::json out = {{"impl", "cohort"},
                          {"model", a.model},
                          {"precision", a.precision},
                          {"batch", a.batch},
                          {"image", a.image},
                          {"classes", a.classes},
                          {"channels_last", a.channels_last},
                          {"cuda_graph", graph_used},
                          {"foreach", foreach},
                          {"steps", timed_steps},
                          {"warmup", a.warmup},
                          {"epochs", a.epochs ? nlohmann::json(a.epochs) : nlohmann::json()},
                          {"dataset_size", a.epochs ? nlohmann::json(a.dataset_size) : nlohmann::json()},
                          {"images_per_second", timed_steps * a.batch / seconds},
                          {"seconds", seconds},
                          {"peak_memory_bytes", nullptr},
                          {"device", device.str()},
                          {"torch", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR)}};
#if COHORT_HAVE_CUDA
    if (device.is_cuda()) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      out["peak_memory_bytes"] = stats.allocated_bytes[0].peak;
    }
#endif
    if (mp.scaling()) out["final_loss_scale"] = mp.loss_scale();
    if (step.phases.on) {
      nlohmann::json ms;
      for (const auto& [phase, sec] : step.phases.seconds) ms[phase] = 1e3 * sec / static_cast<double>(timed_steps);
      out["phase_ms"] = ms;
    }
    if (a.count_ops) out.update(ops.report(timed_steps));
    if (!note.empty()) out["note"] = note;
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "gpu_train_step: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
