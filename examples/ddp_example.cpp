// A LibTorch user's own training program with cohort's DDP: no cohort CLI, no config files.
// Run it with cohort's launcher, torchrun, Slurm or mpirun, for example:
//   torchrun --nproc_per_node 2 --no_python build/examples/ddp_example
// or by hand: RANK=0 WORLD_SIZE=2 MASTER_PORT=29600 build/examples/ddp_example & RANK=1 WORLD_SIZE=2 ...
#include <iostream>

#include <torch/torch.h>

#include "cohort/cohort.h"

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

int main() {
  // 1. Join the job: rank and world size come from whichever launcher started us.
  cohort::comm::World world = cohort::comm::rendezvous(cohort::comm::world_from_env(cohort::comm::current_env()),
                                                       "gloo", std::chrono::seconds(60));
  const int rank = world.info.rank, size = world.info.world_size;
  at::set_num_threads(1);

  // 2. Any torch::nn::Module; DDP checks every rank built the same one and copies rank 0's weights.
  Net net;
  cohort::parallel::ddp::DistributedDataParallel ddp(net.ptr(), world.comm);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  // 3. A synthetic dataset, sharded across ranks like torch's DistributedSampler.
  torch::manual_seed(0);
  auto images = torch::randn({4096, 1, 28, 28});
  auto labels = images.mean({1, 2, 3}).gt(0).to(torch::kLong);  // a learnable rule
  cohort::data::DistributedSampler sampler(images.size(0), size, rank, /*shuffle=*/true, /*seed=*/0, false);

  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto mine = sampler.indices(epoch);
    double loss_sum = 0;
    int64_t batches = 0;
    for (size_t b = 0; b + 64 <= mine.size(); b += 64) {
      auto idx = torch::tensor(std::vector<int64_t>(mine.begin() + b, mine.begin() + b + 64));
      auto loss =
          torch::nn::functional::cross_entropy(net->forward(images.index_select(0, idx)), labels.index_select(0, idx));
      opt.zero_grad();
      loss.backward();  // gradients are averaged across ranks, bucket by bucket, during this call
      opt.step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    // 4. Any collective is available too: here, the loss averaged over ranks.
    auto avg = torch::tensor({loss_sum / batches}, torch::kDouble);
    world.comm->all_reduce(avg, cohort::comm::ReduceOp::kSum, "epoch loss")->wait();
    if (rank == 0) std::cout << "epoch " << epoch << " loss " << avg.item<double>() / size << std::endl;
  }
  world.comm->barrier("done")->wait();
  return 0;
}
