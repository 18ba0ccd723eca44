"""Peer of cohort's default job with a precision and a memory layout: PyTorch (Python) DDP on CPU/Gloo,
Fashion-MNIST, the shared peer's small ResNet, data, optimizer, schedule and flips
(../../../shared/peers/torch_ddp_fmnist.py, imported, not copied), plus what a PyTorch user adds by hand
for speed: --bf16 (torch.autocast on CPU, logits to float32 for the loss) and --channels-last (model and
input in torch.channels_last). Without either flag it is the shared peer's step, PyTorch's defaults.
Usage: python3 torch_ddp_fmnist_amp.py --nproc 2 --epochs 3 --threads 1 [--bf16] [--channels-last]
Prints one JSON object: images/s, training time, test accuracy (evaluated at the end, in fp32)."""
import argparse, json, os, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shared_peer import SHARED, shared_peer  # noqa: E402


def worker(rank, a):
    peer = shared_peer()
    torch.set_num_threads(a.threads)
    if a.nproc > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
        dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    torch.manual_seed(a.seed)
    x, y = peer.load("train")
    xt, yt = peer.load("t10k")
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    m = peer.net().to(memory_format=fmt)
    model = DDP(m) if a.nproc > 1 else m
    steps_per_epoch = len(x) // (a.batch * a.nproc)
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * a.nproc, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1 * a.nproc, total_steps=a.epochs * steps_per_epoch)
    g = torch.Generator()
    t0 = time.time()
    seen = 0
    for ep in range(a.epochs):
        g.manual_seed(ep + 1000 * a.seed)  # seed 0: the shared peer's order
        perm = torch.randperm(len(x), generator=g)
        mine = perm[rank::a.nproc][: steps_per_epoch * a.batch]
        model.train()
        for s in range(steps_per_epoch):
            idx = mine[s * a.batch:(s + 1) * a.batch]
            xb, yb = x[idx], y[idx]
            flip = torch.rand(len(xb), generator=g) < 0.5
            xb = torch.where(flip[:, None, None, None], xb.flip(3), xb).contiguous(memory_format=fmt)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                logits = model(xb)
            loss = F.cross_entropy(logits.float(), yb, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            seen += len(xb)
            if a.limit_steps and s + 1 >= a.limit_steps:
                break
    train_s = time.time() - t0
    m.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(xt), 1000):
            correct += (m(xt[i:i + 1000].contiguous(memory_format=fmt)).argmax(1) == yt[i:i + 1000]).sum().item()
    if rank == 0:
        print(json.dumps(dict(peer="pytorch-%s-ddp" % torch.__version__, bf16=a.bf16, channels_last=a.channels_last,
                              nproc=a.nproc, threads=a.threads, seed=a.seed, batch=a.batch, epochs=a.epochs,
                              limit_steps=a.limit_steps, train_s=round(train_s, 2),
                              images_per_s=round(seen * a.nproc / train_s, 1), test_acc=correct / len(xt))))
    if a.nproc > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit-steps", type=int, default=0)
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="weights and data order (0: the shared peer's)")
    a = p.parse_args()
    if not os.path.exists(SHARED):
        sys.exit("the shared peer is missing: " + SHARED)
    if a.nproc == 1:
        worker(0, a)
    else:
        mp.spawn(worker, args=(a,), nprocs=a.nproc, join=True)
