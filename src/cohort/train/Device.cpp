#include "cohort/train/Device.h"

#include <torch/cuda.h>

#include "cohort/util/Error.h"

namespace cohort::train {

c10::Device training_device(const std::string& setting, int local_rank) {
  if (setting == "cpu") return c10::Device(c10::kCPU);
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (setting == "auto") return local_rank < gpus ? c10::Device(c10::kCUDA, local_rank) : c10::Device(c10::kCPU);
  if (setting != "cuda")
    throw ConfigError("train.device '" + setting + "' is not a device cohort knows", "use auto, cpu or cuda");
  if (gpus == 0)
    throw ConfigError(
        "train.device=cuda, but this LibTorch sees no GPU (built without CUDA, no driver, or "
        "CUDA_VISIBLE_DEVICES empty)",
        "use train.device=cpu, or build cohort against a CUDA LibTorch (scripts/gpu-check)");
  if (local_rank >= gpus)
    throw ConfigError("train.device=cuda: local rank " + std::to_string(local_rank) + " needs GPU " +
                          std::to_string(local_rank) + ", but this machine shows " + std::to_string(gpus),
                      "start at most " + std::to_string(gpus) + " workers per machine (--nproc-per-node)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void configure_device(const c10::Device& device, bool cudnn_benchmark) {
  if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(cudnn_benchmark);
}

// Note [Channels-last strides, not just channels-last contiguity]
// With one channel (Fashion-MNIST's images, the first convolution's kernel) NCHW and NHWC are the same
// bytes, and contiguous(ChannelsLast) returns such a tensor as it is, NCHW strides and all, because
// contiguity checks skip size-1 dimensions. Convolution decides its layout from the strides, so the
// first layer would then compute in NCHW and every later layer would reorder to NHWC and back (8% of
// the default job's step, measured). PyTorch's Module.to(memory_format=...) copies into fresh NHWC
// strides; so does this.
at::Tensor with_channels_last_strides(const at::Tensor& t) {
  if (t.dim() != 4 || t.strides() == c10::IntArrayRef(c10::get_channels_last_strides_2d(t.sizes()))) return t;
  auto out = at::empty_like(t, t.options(), at::MemoryFormat::ChannelsLast);
  out.copy_(t);
  return out;
}

void to_channels_last(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters(/*recurse=*/true)) p.set_data(with_channels_last_strides(p));
  for (auto& b : model.buffers(/*recurse=*/true)) b.set_data(with_channels_last_strides(b));
}

at::Tensor images_to(const at::Tensor& images, const c10::Device& device, bool channels_last) {
  auto out = images.device() == device ? images : images.to(device, /*non_blocking=*/images.is_pinned());
  return channels_last ? with_channels_last_strides(out) : out;
}

}  // namespace cohort::train
