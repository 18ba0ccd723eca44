#!/usr/bin/env python3
"""torch_train_step.py's step under PyTorch's DistributedDataParallel: --workers processes on this machine,
Gloo over loopback, --threads intra-op threads each, as `cohort train --nproc-per-node N train.threads=T`
runs. Each rank trains on its own random batch [--batch, 3, --image, --image], resident in memory (the
data pipeline is not timed); DDP at its defaults (25 MB buckets, all-reduce overlapped with backward).
The model, optimizer, loss, precision and layout flags are torch_train_step.py's (same names, same meaning;
--device is cpu). After --warmup untimed steps, the ranks meet at a barrier and time --steps steps to a
second barrier. Rank 0 prints ONE JSON object: images_per_second over all ranks, seconds, the settings.

  /usr/bin/python3 bench/peers/torch_ddp_train_step.py --workers 2 --threads 1 --model resnet20 \\
      --batch 256 --steps 10 --warmup 2 --precision bf16 --channels-last
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train_step as tts  # noqa: E402


def worker(rank, a, step_args):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.workers)
    s = tts.parse_args(step_args + ["--device", "cpu"])
    torch.manual_seed(s.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    fmt = torch.channels_last if s.channels_last else torch.contiguous_format
    model = tts.build_model(s).to(memory_format=fmt).train()
    step = tts.Step(s, torch.nn.parallel.DistributedDataParallel(model), torch.float32)
    gen = torch.Generator().manual_seed(s.seed + 1 + rank)  # each rank its own batch
    x = torch.randn(s.batch, 3, s.image, s.image, generator=gen).to(memory_format=fmt)
    y = torch.randint(0, s.classes, (s.batch,), generator=gen)
    for _ in range(s.warmup):
        step.eager(x, y)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(s.steps):
        step.eager(x, y)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"impl": "torch_ddp", "torch": torch.__version__, "model": s.model, "workers": a.workers,
                          "threads": a.threads, "batch_per_worker": s.batch, "image": s.image,
                          "precision": s.precision, "channels_last": s.channels_last, "steps": s.steps,
                          "warmup": s.warmup, "seconds": seconds,
                          "images_per_second": s.steps * s.batch * a.workers / seconds}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=29563)
    a, step_args = ap.parse_known_args()
    tts.parse_args(step_args + ["--device", "cpu"])  # its errors before any process starts
    mp.spawn(worker, args=(a, step_args), nprocs=a.workers, join=True)


if __name__ == "__main__":
    main()
