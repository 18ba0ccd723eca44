#!/usr/bin/env python3
"""The FLOPs cohort counts (models/Flops.h, through cohort_reference_tool) against PyTorch's own
torch.utils.flop_counter on the namesake models, forward and backward on the same batch shape: torchvision's
resnet18 and resnet50 and timm's vit_base_patch32_224 at 224 pixels. Within 2% each, as MFU figures compare
only when their FLOPs do. (On CPU flop_counter misses timm's attention products, 1.06% of ViT-B/32's
FLOPs; they are added to its figure, see unseen_attention.)

  flops.py TOOL
"""
import json
import subprocess
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

BOUND = 0.02
BATCH = 2


def reference(name):
    torch.manual_seed(0)
    if name == "vit_b32":
        import timm
        return timm.create_model("vit_base_patch32_224", pretrained=False)
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
    x = torch.randn(BATCH, 3, 224, 224)
    with FlopCounterMode(display=False) as forward:
        loss = model(x).sum()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    extra = unseen_attention(model, forward.get_flop_counts()["Global"])
    return forward.get_total_flops() + extra[0], backward.get_total_flops() + extra[1], extra


def main():
    tool = sys.argv[1]
    failed = []
    for name in ("resnet18", "resnet50", "vit_b32"):
        p = subprocess.run([tool, "flops", str(BATCH), "224", "3", f"model.name={name}", "model.num_classes=1000"],
                           capture_output=True, text=True, timeout=900)
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
