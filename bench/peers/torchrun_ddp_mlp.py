"""One worker of PyTorch's DDP, ZeRO-1 or FSDP under torchrun, training cohort's model.name=mlp (784-32-32-10,
ReLU) on Fashion-MNIST, for bench/scale.py (cohort's launcher and strategies against torchrun and PyTorch's).

The data comes from the team's shared peer (../../../shared/peers/torch_ddp_fmnist.py, imported, not copied).
Each worker takes its own slice of a shuffled epoch, --batch samples a step, plain SGD (lr 0.05), fp32, one
torch thread, Gloo: the same work cohort's `train --nproc-per-node N model.name=mlp` does per step.

Usage: torchrun --standalone --nproc_per_node N torchrun_ddp_mlp.py --steps 60 --batch 32 [--strategy zero1]
Rank 0 prints one JSON line: {"workers", "steps", "train_s" (first step to last), "init_s" (process start
to the process group being ready)}."""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import argparse, json, sys, time

T0 = time.time()
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shared_peer import shared_peer  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--strategy", choices=["ddp", "zero1", "fsdp"], default="ddp",
                   help="ddp: DistributedDataParallel; zero1: DDP with ZeroRedundancyOptimizer (optimizer state "
                        "sharded); fsdp: FSDP2's fully_shard on each Linear and the model (parameters sharded)")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    init_s = time.time() - T0
    x, y = shared_peer().load("train")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    if a.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    else:
        model = DDP(net)
    if a.strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator()
    g.manual_seed(0)
    mine = torch.randperm(len(x), generator=g)[rank::world]
    dist.barrier()
    t = time.time()
    for s in range(a.steps):
        idx = mine[(s * a.batch) % (len(mine) - a.batch):][:a.batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    if rank == 0:
        print(json.dumps(dict(workers=world, strategy=a.strategy, steps=a.steps, train_s=round(time.time() - t, 3),
                              init_s=round(init_s, 3), torch=torch.__version__)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
