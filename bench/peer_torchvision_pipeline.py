#!/usr/bin/env python3
"""The torchvision peer of bench/input_pipeline.cpp: the same work on the same JPEG folder with PIL and
torchvision (Debian's: PIL 9.4, torchvision 0.14; the reference environment's: PIL 13, torchvision 0.29): Image.open(f).convert('RGB'), RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize, with 1 and 2 worker processes, each doing its share of the files
(worker w takes files w, w + k, ...), torch.set_num_threads(1) in each. Like cohort's bench, results stay in
the worker (no transfer to a parent), so both sides time the same per-image work. Prints one JSON line.
Run with either Python. Usage: peer_torchvision_pipeline.py --dir DIR [--repeats 3]"""
import argparse, glob, json, multiprocessing as mp, os, statistics, time

import torch
import torchvision.transforms as T
from PIL import Image


def transform():
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))])


def worker(files, seed, barrier, queue):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tf = transform()
    for f in files[:4]:  # warm-up: imports, allocator, first-call paths
        tf(Image.open(f).convert("RGB"))
    barrier.wait()
    t0 = time.perf_counter()
    checksum = 0.0
    for f in files:
        with open(f, "rb") as fh:
            img = Image.open(fh).convert("RGB")
        checksum += float(tf(img)[0, 0, 0])
    queue.put((t0, time.perf_counter(), checksum))


def run_pass(files, workers, seed):
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(files[w::workers], seed * 100 + w, barrier, queue))
             for w in range(workers)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    return len(files) / (end - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "*.jpg")))
    if not files:
        raise SystemExit(f"no .jpg files in {a.dir}")
    runs = {1: [], 2: []}
    for r in range(a.repeats):
        for k in (1, 2):
            runs[k].append(run_pass(files, k, r))
    print(json.dumps({"torchvision": {f"workers_{k}": round(statistics.median(v), 2) for k, v in runs.items()},
                      "runs": {f"workers_{k}": [round(x, 2) for x in v] for k, v in runs.items()},
                      "images": len(files), "dir": a.dir,
                      "versions": {"torch": torch.__version__, "torchvision": __import__("torchvision").__version__,
                                   "PIL": Image.__version__}}))


if __name__ == "__main__":
    main()
