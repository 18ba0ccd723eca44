// Where a worker trains (train.device) and the per-device settings that go with it: a GPU per local
// rank, as torchrun's convention has it, cuDNN autotuning, and channels-last memory format.
//
//   const c10::Device device = cohort::train::training_device(cfg.train.device, info.local_rank);
//   model->to(device);
//   if (cfg.train.channels_last) cohort::train::to_channels_last(*model);
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace cohort::train {

// "cpu", "cuda" (device local_rank) or "auto" (cuda when LibTorch sees a GPU for this local rank).
// Throws ConfigError for cuda without a usable GPU, naming the local rank and the GPUs seen.
c10::Device training_device(const std::string& setting, int local_rank);

// cuDNN autotuning on or off (only meaningful on CUDA).
void configure_device(const c10::Device& device, bool cudnn_benchmark);

// A 4-d tensor with NHWC strides (a copy unless it has them already), even where it has one channel;
// see Note [Channels-last strides, not just channels-last contiguity] in Device.cpp.
at::Tensor with_channels_last_strides(const at::Tensor& t);

// Every 4-d parameter and buffer (conv kernels) in channels-last (NHWC) memory; shapes and names
// are unchanged, so checkpoints and state dicts are too.
void to_channels_last(torch::nn::Module& model);

// A batch of images on `device`, channels-last when asked. Copies from pinned memory are asynchronous.
at::Tensor images_to(const at::Tensor& images, const c10::Device& device, bool channels_last);

}  // namespace cohort::train
