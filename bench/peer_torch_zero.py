"""Peer for bench/sharded_step.py and bench/vs_pytorch.py: PyTorch DDP with AdamW, DDP with
ZeroRedundancyOptimizer(AdamW) (its ZeRO-1), or FSDP2 (`fully_shard` on each residual block, then on the
root: cohort's dist.fsdp_unit=block; torch >= 2.6, whose Gloo group has the reduce-scatter FSDP needs),
2 workers on CPU/Gloo, on the team peer's data and ResNet-8 (../shared/peers/torch_ddp_fmnist.py).
Usage: python3 peer_torch_zero.py ddp|zero|fsdp STEPS BATCH WARMUP PORT   -> {"images_per_s": ..., "torch": ...}"""
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers"))
import torch_ddp_fmnist as base  # noqa: E402


def wrap(mode):
    """The model and its optimizer as a PyTorch user writes them for `mode`."""
    net = base.net()
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in net:
            if isinstance(layer, base.Block):
                fully_shard(layer)
        fully_shard(net)
        return net, torch.optim.AdamW(net.parameters(), lr=0.002)
    model = DDP(net)
    if mode == "zero":
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.002)
    return model, torch.optim.AdamW(model.parameters(), lr=0.002)


def worker(rank, mode, steps, batch, warmup, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    x, y = base.load("train")
    model, opt = wrap(mode)
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
        print(json.dumps({"images_per_s": (steps - warmup) * 2 * batch / (time.time() - t0), "torch": torch.__version__}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, steps, batch, warmup, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    if mode not in ("ddp", "zero", "fsdp"):
        sys.exit("peer_torch_zero.py: mode must be ddp, zero or fsdp, not " + mode)
    mp.spawn(worker, args=(mode, steps, batch, warmup, port), nprocs=2, join=True)
