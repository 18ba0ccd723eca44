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
    throw ConfigError("train.device=cuda, but this LibTorch sees no GPU (built without CUDA, no driver, or "
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

void to_channels_last(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters(/*recurse=*/true))
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  for (auto& b : model.buffers(/*recurse=*/true))
    if (b.dim() == 4) b.set_data(b.contiguous(at::MemoryFormat::ChannelsLast));
}

at::Tensor images_to(const at::Tensor& images, const c10::Device& device, bool channels_last) {
  auto out = images.device() == device ? images : images.to(device, /*non_blocking=*/images.is_pinned());
  if (channels_last && out.dim() == 4) out = out.contiguous(at::MemoryFormat::ChannelsLast);
  return out;
}

}  // namespace cohort::train
