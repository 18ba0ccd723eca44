// The floating-point operations of a model's work, counted at ATen's level the way PyTorch's
// torch.utils.flop_counter counts them, so cohort's figures and PyTorch users' compare: matrix products
// (mm, addmm, bmm, baddbmm) and convolutions, forward and backward, 2 FLOPs per multiply-add. Norms,
// activations, losses and the optimizer are not counted, as there. The trainer counts its first step
// with it (summary.json's flops_per_image and achieved_tflops; Note [Counting FLOPs] in Flops.cpp).
//
//   double per_image;
//   {
//     cohort::models::FlopCounter count;         // counts every thread's operators while it lives
//     model->forward(images).sum().backward();
//     per_image = count.total() / images.size(0);
//   }
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace cohort::models {

class FlopCounter {
 public:
  // It observes the whole process's dispatcher, every thread: one counter at a time, and a second one
  // made while another counts does not count (counting() is false, total() -1).
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  bool counting() const { return handle_ != 0; }
  double total() const;
  // By operator ("aten::convolution", "aten::convolution_backward", "aten::mm", ...).
  std::map<std::string, double> by_op() const;

 private:
  // at::CallbackHandle. Flops.cpp alone includes record_function.h (Note [RecordFunction in a debug build]).
  uint64_t handle_ = 0;
};

}  // namespace cohort::models
