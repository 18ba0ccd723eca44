#!/usr/bin/env python3
"""ResNet-50 training at 224x224 on CPU: cohort next to PyTorch in Python (Debian's python3-torch and
python3-torchvision), in the same run.

Both train torchvision's ResNet-50 (10 classes) with SGD (momentum 0.9, nesterov), cross-entropy with label
smoothing 0.1, batch --batch, --threads intra-op threads, one process. cohort reads CIFAR-10-format files
made here (random pixels), resized to 224 in the batch; the peer uses random 224x224 tensors. The first
--warmup steps are not timed. The two alternate --rounds times; medians and the ratio are reported, also
against the peer run with the glibc malloc settings cohort's train.retain_memory uses.
Run: /usr/bin/python3 bench/resnet50_cpu.py --cohort build/cohort --out bench/results/resnet50_cpu.json"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np


def fake_cifar(root, n):
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        rec = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], axis=1)
        rec.astype(np.uint8).tofile(os.path.join(root, name))


def run_cohort(a, data):
    run = tempfile.mkdtemp(prefix="cohort-r50-")
    cmd = [a.cohort, "train", "--nproc-per-node", "1", "--run-dir", run, "model.name=resnet50", "data.name=cifar10",
           f"data.root={data}", "data.image_size=224", f"data.batch_size={a.batch}", "data.augment=false",
           f"train.threads={a.threads}", f"train.max_steps={a.warmup + a.steps}", "eval.enabled=false",
           "amp.precision=fp32", "train.channels_last=false",  # the peer runs fp32, contiguous
           "ckpt.save_best=false", "log.every_steps=1", "log.progress=plain", "optim.lr=0.01", "sched.name=constant"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("cohort failed: " + p.stderr[-2000:])
    train = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"kind":"train"' in l]
    t0 = next(r["train_seconds"] for r in train if r["step"] == a.warmup)
    t1 = next(r["train_seconds"] for r in train if r["step"] == a.warmup + a.steps)
    return a.steps * a.batch / (t1 - t0)


PEER = r'''
import sys, time, torch, torchvision
batch, threads, warmup, steps = map(int, sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)
net = torchvision.models.resnet50(num_classes=10)
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 10, (batch,))
for i in range(warmup + steps):
    if i == warmup:
        t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss_fn(net(x), y).backward()
    opt.step()
print(steps * batch / (time.perf_counter() - t0))
'''


# What cohort's train.retain_memory asks of glibc (util/Memory.cpp), as tunables for the Python peer, so
# the comparison can also be made with the same allocator settings.
RETAIN = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"


def run_peer(a, retain=False):
    env = dict(os.environ, GLIBC_TUNABLES=RETAIN) if retain else None
    p = subprocess.run(["/usr/bin/python3", "-c", PEER, str(a.batch), str(a.threads), str(a.warmup), str(a.steps)],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("peer failed: " + p.stderr[-2000:])
    return float(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    data = tempfile.mkdtemp(prefix="cohort-r50-data-")
    fake_cifar(data, max(64, a.batch * (a.warmup + a.steps)))
    cohort, peer, peer_retain = [], [], []
    for _ in range(a.rounds):
        cohort.append(run_cohort(a, data))
        peer.append(run_peer(a))
        peer_retain.append(run_peer(a, retain=True))
    res = {"bench": "resnet50_cpu", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "batch": a.batch,
           "threads": a.threads, "timed_steps": a.steps, "warmup_steps": a.warmup, "cores": os.cpu_count(),
           "images_per_s": {"cohort": cohort, "pytorch": peer, "pytorch_same_malloc": peer_retain},
           "median_images_per_s": {"cohort": statistics.median(cohort), "pytorch": statistics.median(peer),
                                   "pytorch_same_malloc": statistics.median(peer_retain)},
           "ratio_cohort_over_pytorch": statistics.median(cohort) / statistics.median(peer),
           "ratio_cohort_over_pytorch_same_malloc": statistics.median(cohort) / statistics.median(peer_retain)}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
