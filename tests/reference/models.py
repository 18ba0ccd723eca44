#!/usr/bin/env python3
"""cohort's models against their namesakes, timm's vit_base_patch32_224 and torchvision's resnet18 and
resnet50, through the `cohort` binary as a user runs it (ctest label `reference`, in the reference
environment that scripts/pip-libtorch makes).

  models.py COHORT TOOL MODEL WORKDIR       MODEL: vit_b32, resnet18 or resnet50; TOOL: cohort_reference_tool

1. The reference model with random weights (seeded; random batch-norm statistics for the ResNets), saved
   with safetensors: `cohort predict --input` gives the reference's eval-mode logits on the same batch,
   max |difference| <= 1e-4 * max |reference logit|.
2. cohort fine-tunes those weights for two steps on a small JPEG folder and `cohort export`s them: the file
   loads into the reference model with strict=True and gives cohort's logits, within the same bound.
3. On 8 JPEG files, cohort's evaluation transform gives the reference's own transform's tensors exactly
   (timm's resolve_data_config/create_transform on PIL images; torchvision: the weights' transforms()
   preset, IMAGENET1K_V1 for resnet18 and IMAGENET1K_V2, the DEFAULT, for resnet50), and `cohort
   predict`'s top-5 classes are the reference model's on them.

cohort's models are their namesakes exactly (1000 classes, 224 pixels, the same layers and names); no
difference to state.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

BOUND = 1e-4


def reference(name):
    """The reference model (eval mode) and its eval transform."""
    torch.manual_seed(0)
    if name == "vit_b32":
        import timm
        import timm.data
        m = timm.create_model("vit_base_patch32_224", pretrained=False)
        t = timm.data.create_transform(**timm.data.resolve_data_config({}, model=m))
    else:
        import torchvision
        from torchvision.models import ResNet18_Weights, ResNet50_Weights
        m = getattr(torchvision.models, name)(weights=None)
        # Random running statistics, so a mix-up of mean and var or of two layers shows in the logits.
        g = torch.Generator().manual_seed(1)
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.running_mean.shape, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=g) + 0.5)
        preset = ResNet18_Weights.IMAGENET1K_V1 if name == "resnet18" else ResNet50_Weights.IMAGENET1K_V2
        t = preset.transforms()
    return m.eval(), t


def run(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, args))}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def check_close(what, got, want):
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"{what}: max |diff| {diff:.3g}, max |logit| {scale:.3g}, ratio {diff / scale:.3g} (bound {BOUND})")
    if not diff <= BOUND * scale:
        sys.exit(f"FAILED: {what}: {diff} > {BOUND} * {scale}")


def write_jpegs(folder, count, seed):
    """Smooth colour fields with shapes and noise, of assorted sizes and aspect ratios."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for i in range(count):
        w, h = int(rng.integers(230, 640)), int(rng.integers(230, 520))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.zeros((h, w, 3), np.float32)
        for c in range(3):
            fx, fy, ph = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
            img[..., c] = 128 + 100 * np.sin(x * fx + y * fy + ph)
        cx, cy, r = rng.integers(0, w), rng.integers(0, h), rng.integers(20, 120)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
        img += rng.normal(0, 8, img.shape)
        path = os.path.join(folder, f"img{i}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        files.append(path)
    return files


def main():
    cohort, tool, name, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    model, transform = reference(name)
    keys = [f"model.name={name}", "model.num_classes=1000", "data.name=imagefolder", "data.image_size=224"]
    weights = os.path.join(work, "ref.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    save_file({"images": x}, os.path.join(work, "x.safetensors"))

    # 1. Reference weights in cohort.
    with torch.no_grad():
        want = model(x)
    out = os.path.join(work, "logits.safetensors")
    run(cohort, "predict", "--checkpoint", weights, "--input", os.path.join(work, "x.safetensors"), "--out", out, *keys)
    check_close(f"{name}: reference weights, cohort's logits", load_file(out)["logits"], want)

    # 2. cohort's weights in the reference model.
    data = os.path.join(work, "folder")
    for split, n in (("train", 4), ("val", 2)):
        for c in ("a", "b"):
            write_jpegs(os.path.join(data, split, c), n, seed={"train": 10, "val": 20}[split] + ord(c))
    run_dir = os.path.join(work, "run")
    run(cohort, "train", "--nproc-per-node", "1", "--run-dir", run_dir, *keys, f"model.pretrained={weights}",
        f"data.root={data}", "data.batch_size=2", "train.max_steps=2", "optim.lr=0.001", "eval.batch_size=4",
        "data.workers=1")
    exported = os.path.join(work, "exported.safetensors")
    run(cohort, "export", run_dir, "--out", exported)
    trained = load_file(exported)
    moved = max((trained[k].float() - v.float()).abs().max().item() for k, v in model.state_dict().items())
    if not moved > 0:
        sys.exit("FAILED: two training steps left every weight as it was")
    tuned, _ = reference(name)
    tuned.load_state_dict(trained, strict=True)
    run(cohort, "predict", "--checkpoint", exported, "--input", os.path.join(work, "x.safetensors"), "--out", out, *keys)
    with torch.no_grad():
        check_close(f"{name}: cohort's trained weights, reference logits", load_file(out)["logits"], tuned.eval()(x))

    # 3. Top-5 on JPEG files, each side with its own preprocessing.
    files = write_jpegs(os.path.join(work, "jpegs"), 8, seed=3)
    batch = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
    mine = os.path.join(work, "preprocessed.safetensors")
    run(tool, "preprocess", mine, *files, *keys)
    pixel_diff = (load_file(mine)["images"] - batch).abs().max().item()
    print(f"{name}: eval transform of 8 JPEGs, max |cohort - reference| {pixel_diff:.3g}")
    if not pixel_diff <= 1e-6:
        sys.exit(f"FAILED: cohort's evaluation transform differs from the reference's by {pixel_diff}")
    lines = run(cohort, "predict", "--checkpoint", weights, *files, *keys).splitlines()
    got = {json.loads(l)["file"]: [e["class"] for e in json.loads(l)["top"]] for l in lines}
    with torch.no_grad():
        ref_top = model(batch).topk(5, dim=1).indices.tolist()
    for f, want5 in zip(files, ref_top):
        print(f"{os.path.basename(f)}: cohort {got.get(f)}, reference {want5}")
        if got.get(f) != want5:
            sys.exit(f"FAILED: top-5 of {f} differs")
    print(f"{name}: all checks passed")


if __name__ == "__main__":
    main()
