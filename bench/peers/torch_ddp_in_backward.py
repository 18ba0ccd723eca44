#!/usr/bin/env python3
"""The PyTorch peer of bench/in_backward.py: one worker of PyTorch's DDP over Gloo, with the optimizer
stepped after backward (--mode plain) or by DDP's fused optimizer (--mode fused:
DistributedDataParallel._register_fused_optim, which steps each bucket's parameters in the communication
hook once its all-reduce is done, like cohort's optim.in_backward). Started in each network namespace
with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Models as cohort builds them for Fashion-MNIST at --image pixels: torchvision's resnet18 / resnet50 /
vit_b_32 with a 1-channel stem and 10 classes. SGD (momentum 0.9, Nesterov, weight decay 5e-4) or AdamW
(weight decay 0.05), one thread, fixed random batches (timing only). Prints one JSON line on rank 0:
seconds per step over the timed steps (one untimed step first).
Usage: torch_ddp_in_backward.py --model resnet50 --optim sgd --mode fused [--steps 6] [--batch 16] [--image 64]"""
import argparse, json, time
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build(name, image):
    import torchvision
    if name == "vit_b32":
        m = torchvision.models.vit_b_32(image_size=image, num_classes=10)
        old = m.conv_proj
        m.conv_proj = nn.Conv2d(1, old.out_channels, old.kernel_size, old.stride)
        return m
    m = getattr(torchvision.models, name)(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return m


def optimizer_args(name):
    if name == "adamw":
        return torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.05}
    return torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50", "vit_b32"])
    ap.add_argument("--optim", default="sgd", choices=["sgd", "adamw"])
    ap.add_argument("--mode", default="plain", choices=["plain", "fused"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(build(a.model, a.image))
    cls, kwargs = optimizer_args(a.optim)
    opt = None
    if a.mode == "fused":
        model._register_fused_optim(cls, **kwargs)
    else:
        opt = cls(model.parameters(), **kwargs)
    x, y = torch.randn(a.batch, 1, a.image, a.image), torch.randint(0, 10, (a.batch,))
    for i in range(1 + a.steps):
        if i == 1:
            t0 = time.time()
        loss = F.cross_entropy(model(x), y)
        # The fused optimizer leaves .grad as the averaged gradient; clear it so the next backward does
        # not add to it (both modes alike).
        model.zero_grad(set_to_none=True)
        loss.backward()
        if opt is not None:
            opt.step()
    seconds = (time.time() - t0) / a.steps
    if dist.get_rank() == 0:
        print(json.dumps({"peer": "pytorch-%s" % torch.__version__, "model": a.model, "optim": a.optim,
                          "mode": a.mode, "step_seconds": round(seconds, 4)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
