#!/usr/bin/env python3
"""The PyTorch peer of bench/slow_network.py: one DDP worker of PyTorch (Python, Debian's python3-torch)
with its own communication hooks (default_hooks.fp16_compress_hook, powerSGD_hook), on the same
ResNet-18 shape (1-channel 28x28 input, 10 classes), batch and thread count as cohort's runs. Started by
slow_network.py in each network namespace with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Timing only: the batch is fixed random data. Prints one JSON line on rank 0.
Usage: peer_torch_compress.py --compress none|fp16|powersgd [--steps 8] [--batch 64]"""
import argparse, json, os, time
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook


class Block(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); s.bn1 = nn.BatchNorm2d(cout)
        s.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); s.bn2 = nn.BatchNorm2d(cout)
        s.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(s, x):
        o = F.relu(s.bn1(s.conv1(x))); o = s.bn2(s.conv2(o))
        return F.relu(o + (x if s.downsample is None else s.downsample(x)))


def resnet18(classes=10):
    layers, cin = [], 64
    for i, w in enumerate((64, 128, 256, 512)):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]; cin = w
    return nn.Sequential(nn.Conv2d(1, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compress", default="none"); ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(resnet18())
    warmup = 1
    if a.compress == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.compress == "powersgd":
        # PyTorch needs start_powerSGD_iter >= 2 with error feedback or warm start; only the steps after
        # it are timed, so the figure is PowerSGD's own step time.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        warmup = 3
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(a.batch, 1, 28, 28), torch.randint(0, 10, (a.batch,))
    for i in range(warmup + a.steps):
        if i == warmup:
            t0 = time.time()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    seconds = (time.time() - t0) / a.steps
    if dist.get_rank() == 0:
        print(json.dumps({"peer": "pytorch-%s" % torch.__version__, "compress": a.compress,
                          "step_seconds": round(seconds, 3)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
