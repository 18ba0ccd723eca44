#!/usr/bin/env python3
"""The ready configs (configs/*.toml) under amp.precision=auto and train.channels_last=auto against fp32
and the contiguous layout, on short runs of generated data, in one run: does auto give up accuracy?

The data is made here and is learnable but not trivial: each class has a fixed random smooth pattern,
and every image is that pattern plus strong per-pixel noise. CIFAR-10's binary batches feed airbench
and ViT-B/32; a folder of JPEG files (data.root/{train,val}/<class>/*.JPEG) feeds ResNet-50. The configs
run as written except for what a short run on a small machine needs: sizes, epochs, warmup, and no
pretrained file. Each pair runs with the same seed, so the difference between them is the precision
and layout alone (and bf16 rounding from there on).
Accuracy is compared against the noise of the measurement itself, the standard deviation of the difference
of two accuracies on the same number of test images. Prints JSON; --out also writes it. Run: python3 bench/auto_configs.py --cohort build/cohort"""
import argparse, json, math, os, subprocess, sys, tempfile, time

import numpy as np

from benchlib import emit

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def patterns(classes, size, seed):
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(classes, 3, 4, 4))
    return np.kron(coarse, np.ones((1, 1, size // 4, size // 4)))  # smooth: 4x4 blocks, upsampled


def images(pats, labels, noise, rng):
    x = 128 + 40 * pats[labels] + noise * rng.normal(size=(len(labels),) + pats.shape[1:])
    return np.clip(x, 0, 255).astype(np.uint8)


def make_cifar(root, train, test, noise):
    os.makedirs(root, exist_ok=True)
    pats, rng = patterns(10, 32, 1), np.random.default_rng(2)
    def write(name, n):
        y = rng.integers(0, 10, n)
        x = images(pats, y, noise, rng)
        rec = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(n, -1)], axis=1)
        rec.tofile(os.path.join(root, name))
    for i in range(1, 6):
        write(f"data_batch_{i}.bin", train // 5)
    write("test_batch.bin", test)


def make_folder(root, per_class_train, per_class_val, noise, size=72):
    from PIL import Image
    pats, rng = patterns(10, size, 3), np.random.default_rng(4)
    for split, n in (("train", per_class_train), ("val", per_class_val)):
        for c in range(10):
            d = os.path.join(root, split, f"class{c}")
            os.makedirs(d, exist_ok=True)
            for i, img in enumerate(images(pats, np.full(n, c), noise, rng)):
                Image.fromarray(img.transpose(1, 2, 0)).save(os.path.join(d, f"{i}.JPEG"), quality=90)


def run(a, config, data_root, extra, layout):
    run_dir = tempfile.mkdtemp(prefix="cohort-auto-configs-")
    cmd = [a.cohort, "train", "--config", os.path.join(ROOT, "configs", config), "--run-dir", run_dir,
           "--nproc-per-node", "2", f"data.root={data_root}", "ckpt.save_best=false", "log.progress=off"] + extra + layout
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit("cohort failed: " + " ".join(cmd) + "\n" + p.stdout.decode()[-3000:])
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    return {"precision": s["precision"], "channels_last": s.get("channels_last"), "test_acc": s["test_accuracy"],
            "train_s": round(s["train_seconds"], 1), "wall_s": round(time.time() - t0, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--noise", type=float, default=110.0, help="per-pixel noise standard deviation (0-255 scale)")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cohort-auto-data-")
    cifar, folder = os.path.join(work, "cifar"), os.path.join(work, "folder")
    make_cifar(cifar, train=2000, test=500, noise=a.noise)
    make_folder(folder, per_class_train=40, per_class_val=20, noise=a.noise)
    jobs = [
        ("cifar10_airbench.toml", cifar, ["data.batch_size=100", "train.epochs=4", "eval.batch_size=250"], 500),
        ("imagenet_resnet50.toml", folder, ["model.num_classes=10", "data.image_size=64", "data.batch_size=16",
                                             "data.workers=1", "train.epochs=3", "sched.warmup_epochs=0.5",
                                             "sched.step_epochs=2", "eval.batch_size=50", "log.every_steps=10"], 200),
        # ViT-B/32 keeps its 88M parameters at any image size, and its fp32 matrix products go to the BLAS
        # LibTorch was linked with: on Debian with only libblas3 installed that is the reference BLAS,
        # about 20x slower than oneDNN's bf16 path here. So the smallest run that still learns something:
        # 32x32 images (one patch), 8 steps.
        ("cifar10_vit_b32_finetune.toml", cifar, ["model.pretrained=", "data.image_size=32", "data.batch_size=25",
                                                  "data.train_limit=200", "data.test_limit=200", "train.epochs=2",
                                                  "eval.batch_size=200", "optim.lr=0.02"], 200),
    ]
    res = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "noise": a.noise, "configs": {}}
    for config, root, extra, n_test in jobs:
        auto = run(a, config, root, extra, ["amp.precision=auto", "train.channels_last=auto"])
        fp32 = run(a, config, root, extra, ["amp.precision=fp32", "train.channels_last=false"])
        # Noise: the standard deviation of the difference of two accuracies measured on n_test images each.
        p = (auto["test_acc"] + fp32["test_acc"]) / 2
        sd = 100 * math.sqrt(max(2 * p * (1 - p) / n_test, 1e-12))
        diff = 100 * (auto["test_acc"] - fp32["test_acc"])
        res["configs"][config] = {"overrides": extra, "test_images": n_test, "auto": auto, "fp32": fp32,
                                  "accuracy_difference_points": round(diff, 2), "noise_sd_points": round(sd, 2),
                                  "within_2_sd": abs(diff) <= 2 * sd,
                                  "speedup": round(fp32["train_s"] / auto["train_s"], 2)}
        print(config, json.dumps(res["configs"][config]), file=sys.stderr, flush=True)
    emit(res, a.out)


if __name__ == "__main__":
    main()
