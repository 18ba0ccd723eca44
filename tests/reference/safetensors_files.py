#!/usr/bin/env python3
"""safetensors both ways, with the `safetensors` package of the reference environment:

1. Files written by safetensors.torch.save_file (fp32, fp16, bf16, int64, uint8, bool, a scalar, an empty
   tensor, metadata) are read by cohort's reader and written again by cohort's writer
   (cohort_reference_tool safetensors-copy); safetensors reads that copy back with equal tensors, dtypes,
   shapes and metadata (plus the checksum key cohort.crc32c that cohort's writer adds).
2. Every kind of file a cohort run writes (the model weights of best and last, the training state, the
   shards and step directories of a sharded zero2 save on 2 ranks, bf16 master weights, `cohort export`)
   opens with safetensors.torch.load_file, with tensors equal to what cohort's own reader gives.

  safetensors_files.py COHORT TOOL WORKDIR
"""
import glob
import os
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def run(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, args))}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def metadata(path):
    with safe_open(path, framework="pt") as f:
        return f.metadata() or {}


def same(a, b, what):
    if a.keys() != b.keys():
        sys.exit(f"FAILED: {what}: names differ: {sorted(a.keys() ^ b.keys())}")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]):
            sys.exit(f"FAILED: {what}: tensor {k} differs ({a[k].dtype} {tuple(a[k].shape)} vs "
                     f"{b[k].dtype} {tuple(b[k].shape)})")


def python_to_cohort(tool, work):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w.f32": torch.randn(3, 5, generator=g),
        "w.f16": torch.randn(7, generator=g).half(),
        "w.bf16": torch.randn(2, 3, 4, generator=g).bfloat16(),
        "steps.i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "pixels.u8": torch.randint(0, 256, (4, 4), generator=g, dtype=torch.uint8),
        "mask.bool": torch.rand(5, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    meta = {"format": "pt", "step": "42", "note": "written by safetensors.torch.save_file"}
    src, copy = os.path.join(work, "python.safetensors"), os.path.join(work, "cohort_copy.safetensors")
    save_file(tensors, src, metadata=meta)
    run(tool, "safetensors-copy", src, copy)
    same(load_file(copy), tensors, "safetensors -> cohort -> safetensors")
    # cohort's writer adds the checksum of the data (cohort.crc32c), which its reader verifies.
    kept = {k: v for k, v in metadata(copy).items() if k != "cohort.crc32c"}
    if kept != meta or "cohort.crc32c" not in metadata(copy):
        sys.exit(f"FAILED: metadata {metadata(copy)} != {meta} plus cohort.crc32c")
    print(f"safetensors.torch.save_file -> cohort: {len(tensors)} tensors and the metadata kept")


def cohort_to_python(cohort, tool, work):
    runs = []
    for name, strategy, extra in (("ddp", "ddp", ["amp.precision=bf16"]), ("zero2", "zero2", [])):
        run_dir = os.path.join(work, name)
        run(cohort, "train", "--nproc-per-node", "2", "--run-dir", run_dir, f"dist.strategy={strategy}",
            "train.max_steps=6", "ckpt.every_steps=3", "data.train_limit=512", "data.test_limit=256",
            "data.batch_size=32", *extra)
        runs.append(run_dir)
    run(cohort, "export", runs[1], "--out", os.path.join(work, "zero2_export.safetensors"))
    files = [f for r in runs for f in glob.glob(os.path.join(r, "**", "*.safetensors"), recursive=True)]
    files.append(os.path.join(work, "zero2_export.safetensors"))
    dtypes = set()
    for i, f in enumerate(sorted(files)):
        copy = os.path.join(work, f"cohort_read_{i}.safetensors")
        run(tool, "safetensors-copy", f, copy)  # what cohort's reader sees, written back as is
        theirs = load_file(f)
        same(theirs, load_file(copy), f)
        dtypes |= {str(t.dtype) for t in theirs.values()}
    print(f"cohort -> safetensors.torch.load_file: {len(files)} files ({', '.join(sorted(dtypes))}) equal")


def main():
    cohort, tool, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    python_to_cohort(tool, work)
    cohort_to_python(cohort, tool, work)


if __name__ == "__main__":
    main()
