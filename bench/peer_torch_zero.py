"""Peer for bench/sharded_step.py: PyTorch DDP with AdamW, or with ZeroRedundancyOptimizer(AdamW) (its
ZeRO-1), 2 workers on CPU/Gloo, on the team peer's data and ResNet-8 (../shared/peers/torch_ddp_fmnist.py).
Usage: python3 peer_torch_zero.py ddp|zero STEPS BATCH WARMUP PORT   -> {"images_per_s": ...}"""
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers"))
import torch_ddp_fmnist as base  # noqa: E402


def worker(rank, zero, steps, batch, warmup, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    x, y = base.load("train")
    model = DDP(base.net())
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.002)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.002)
    g = torch.Generator()
    g.manual_seed(0)
    mine = torch.randperm(len(x), generator=g)[rank::2]
    for s in range(steps):
        if s == warmup:
            t0 = time.time()
        idx = mine[s * batch:(s + 1) * batch]
        loss = F.cross_entropy(model(x[idx]), y[idx], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if rank == 0:
        print(json.dumps({"images_per_s": (steps - warmup) * 2 * batch / (time.time() - t0)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, steps, batch, warmup, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    mp.spawn(worker, args=(mode == "zero", steps, batch, warmup, port), nprocs=2, join=True)
