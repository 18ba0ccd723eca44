// What ddp and the sharded strategies both start from, written once: the trainable parameters and their
// description (name, shape, dtype), the check that every rank built the same ones, and the broadcast
// that makes rank 0's values everyone's. The plans (BucketPlan.h, shard/ShardPlan.h) take ParamSpecs.
//
//   auto trainable = cohort::parallel::trainable_parameters(*model, "ddp");
//   cohort::parallel::check_replicas_match(trainable, *comm, "ddp");        // names the parameter and the rank
//   cohort::parallel::broadcast_from_rank0(trainable.params, *comm, "ddp initial parameters");
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t numel() const;
};

struct Trainable {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<ParamSpec> specs() const;
};

// The parameters that require grad, in the module's order. Throws when there are none (`who` names the
// caller in the error), since wrapping a parameter-free container is a mistake.
Trainable trainable_parameters(torch::nn::Module& module, const std::string& who);

// Every rank must have built the same parameters (names, shapes, dtypes), or the flat layouts differ and
// collectives would mix unrelated numbers. All-gathers one row per parameter and throws a CommError that
// names the first rank and parameter that differ from rank 0. Collective.
void check_replicas_match(const Trainable& trainable, comm::Communicator& comm, const std::string& who);

// A broadcast from rank 0 of tensors through one flat copy per dtype (a ResNet has dozens of small
// buffers), in flight between launch() and finish(), so it can overlap other work.
class FlatBroadcast {
 public:
  void launch(const std::vector<at::Tensor>& tensors, comm::Communicator& comm, const std::string& what);
  // Waits and copies rank 0's values into the tensors. A no-op when nothing is in flight.
  void finish();

 private:
  struct Group {
    std::vector<at::Tensor> targets;
    at::Tensor flat;
    comm::HandlePtr handle;
  };
  std::vector<Group> groups_;
};

// Makes `tensors` equal to rank 0's, now.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm, const std::string& what);

}  // namespace cohort::parallel
