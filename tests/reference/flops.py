#!/usr/bin/env python3
"""The FLOPs cohort counts (models/Flops.h, through cohort_reference_tool) against PyTorch's own
torch.utils.flop_counter, forward and backward on the same batch shape, for every model cohort builds
(models/Models.cpp): torchvision's resnet18, resnet34 and resnet50 and timm's vit_base_patch32_224 at 224
pixels; and, written here from cohort's definitions (the same layers, shapes and frozen parameters:
frozen weights have no gradient to count), the CIFAR-style resnet8, resnet14, resnet20 and resnet32 and
the mlp on Fashion-MNIST's 28x28 grey images, and airbench at CIFAR-10's 32x32. Within 2% each, as MFU
figures compare only when their FLOPs do. (On CPU flop_counter misses timm's attention products, 1.06% of
ViT-B/32's FLOPs; they are added to its figure, see unseen_attention.)

  flops.py TOOL
"""
import json
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers"))
from torch_train_step import small_resnet  # noqa: E402  (cohort's SmallResNet, one Python definition)

BOUND = 0.02
BATCH = 2
SMALL_RESNETS = {"resnet8": 1, "resnet14": 2, "resnet20": 3, "resnet32": 5}  # basic blocks per stage
# name: (image size, channels, classes, cohort's extra settings)
MODELS = {"resnet18": (224, 3, 1000, []), "resnet34": (224, 3, 1000, []), "resnet50": (224, 3, 1000, []),
          "vit_b32": (224, 3, 1000, []), "airbench": (32, 3, 10, []), "mlp": (28, 1, 10, ["model.width=256"]),
          **{name: (28, 1, 10, ["model.width=32"]) for name in SMALL_RESNETS}}


class Airbench(nn.Module):
    """cohort's AirbenchNet (models/Airbench.cpp): a frozen 2x2 whitening convolution with a bias, three
    groups of conv-pool-norm-gelu-conv-norm-gelu (widths 64, 256, 256; norm scales frozen), a max over the
    positions and a linear head without bias."""

    def __init__(self, channels, classes):
        super().__init__()
        self.whiten = nn.Conv2d(channels, 2 * channels * 4, 2, bias=True)
        self.whiten.weight.requires_grad_(False)
        self.groups = nn.ModuleList()
        cin = self.whiten.out_channels
        for w in (64, 256, 256):
            g = nn.ModuleDict({"conv1": nn.Conv2d(cin, w, 3, padding=1, bias=False), "norm1": nn.BatchNorm2d(w),
                               "conv2": nn.Conv2d(w, w, 3, padding=1, bias=False), "norm2": nn.BatchNorm2d(w)})
            g["norm1"].weight.requires_grad_(False)
            g["norm2"].weight.requires_grad_(False)
            self.groups.append(g)
            cin = w
        self.head = nn.Linear(cin, classes, bias=False)

    def forward(self, x):
        x = F.gelu(self.whiten(x))
        for g in self.groups:
            x = F.gelu(g["norm1"](F.max_pool2d(g["conv1"](x), 2)))
            x = F.gelu(g["norm2"](g["conv2"](x)))
        return self.head(x.flatten(2).max(2)[0]) / 9


def reference(name):
    torch.manual_seed(0)
    size, channels, classes, _ = MODELS[name]
    if name == "vit_b32":
        import timm
        return timm.create_model("vit_base_patch32_224", pretrained=False)
    if name in SMALL_RESNETS:
        return small_resnet(SMALL_RESNETS[name], 32, channels, classes)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, 256), nn.ReLU(), nn.Linear(256, 256),
                             nn.ReLU(), nn.Linear(256, classes))
    if name == "airbench":
        return Airbench(channels, classes)
    import torchvision
    return getattr(torchvision.models, name)(weights=None)


def unseen_attention(model, counted):
    """FLOPs of attention's two matrix products that flop_counter did not count: on CPU, timm's ViT calls
    scaled_dot_product_attention, whose CPU kernel (_scaled_dot_product_flash_attention_for_cpu) has no
    formula in flop_counter (torch 2.14), so it counts 0 there. 4 b h s^2 d per block forward, twice
    that backward, as flop_counter's formulas for the other attention kernels give."""
    if not hasattr(model, "blocks") or any("attention" in str(op) for op in counted):
        return 0, 0
    tokens = model.patch_embed.num_patches + 1
    a = model.blocks[0].attn
    per_block = 4 * BATCH * a.num_heads * tokens * tokens * a.head_dim
    return per_block * len(model.blocks), 2 * per_block * len(model.blocks)


def torch_flops(name):
    model = reference(name).train()
    size, channels, _, _ = MODELS[name]
    x = torch.randn(BATCH, channels, size, size)
    with FlopCounterMode(display=False) as forward:
        loss = model(x).sum()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    extra = unseen_attention(model, forward.get_flop_counts()["Global"])
    return forward.get_total_flops() + extra[0], backward.get_total_flops() + extra[1], extra


def main():
    tool = sys.argv[1]
    failed = []
    for name, (size, channels, classes, extra) in MODELS.items():
        p = subprocess.run([tool, "flops", str(BATCH), str(size), str(channels), f"model.name={name}",
                            f"model.num_classes={classes}"] + extra, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            sys.exit(f"FAILED: cohort_reference_tool flops {name}: {p.stderr[-2000:]}")
        ours = json.loads(p.stdout)
        theirs = torch_flops(name)
        if theirs[2][0]:
            print(f"{name}: flop_counter plus the attention products it does not see on CPU "
                  f"({theirs[2][0] / BATCH / 1e9:.4f} GFLOP forward per image)")
        for part, mine, ref in (("forward", ours["forward"], theirs[0]), ("backward", ours["backward"], theirs[1])):
            ratio = mine / ref
            line = (f"{name} {part}: cohort {mine / BATCH / 1e9:.4f} GFLOP per image, flop_counter "
                    f"{ref / BATCH / 1e9:.4f} (ratio {ratio:.4f})")
            print(line)
            if abs(ratio - 1) > BOUND:
                failed.append(line + f"; cohort by operator: {ours['by_op'][part]}")
    if failed:
        sys.exit("FAILED: not within 2%:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
