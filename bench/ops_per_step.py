#!/usr/bin/env python3
"""ATen operator calls per training step, cohort against PyTorch, from the profiler's view of each.

cohort's step (bench/gpu_train_step --count-ops: the library's model, loss, mixed precision and optimizer,
counted through RecordFunction) next to PyTorch's (bench/peers/torch_train_step.py --count-ops: the same
model, loss and SGD, counted from torch.profiler's "aten::" events), on the CPU (or with --device cuda on a GPU, where both use multi-tensor SGD and fp16 adds the loss
scaler's operators), for each LibTorch pairing
given (cohort built against one LibTorch, the peer's Python on the same version, so both dispatch to the
same operators). Two counts per side:
  top_level  calls not made inside another operator: what the program and autograd's nodes ask for;
  all        every call, nested ones too (how an operator is built differs between overloads: in 1.13,
             C++'s mul_(Scalar) calls mul.out while Python's mul_ does not, so nested counts differ for
             the same work).
ratio = cohort / torch; the names whose per-step counts differ most are listed, to see where.

  python3 bench/ops_per_step.py --out bench/results/ops_per_step.json
  python3 bench/ops_per_step.py --pair 1.13=build/bench/gpu_train_step,/usr/bin/python3
  python3 bench/ops_per_step.py --device cuda --pair gpu=build-gpu/bench/gpu_train_step,python3   # scripts/gpu-check
Prints JSON."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from benchlib import emit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "peers", "torch_train_step.py")
REFERENCE_PY = os.path.expanduser("~/.cache/cohort/torch-2.14.1/bin/python3")

# name, arguments both sides take. Small images: the count does not depend on the size.
CASES = [
    ("resnet18 fp32", ["--model", "resnet18", "--batch", "4", "--image", "64", "--precision", "fp32"]),
    ("resnet18 bf16 channels-last",
     ["--model", "resnet18", "--batch", "4", "--image", "64", "--precision", "bf16", "--channels-last"]),
    ("resnet50 fp32", ["--model", "resnet50", "--batch", "2", "--image", "64", "--precision", "fp32"]),
    ("airbench94 fp32", ["--model", "airbench94", "--batch", "8", "--image", "32", "--precision", "fp32"]),
]
CUDA_CASES = [
    ("resnet50 fp16 channels-last",
     ["--model", "resnet50", "--batch", "8", "--image", "64", "--precision", "fp16", "--channels-last"]),
    ("resnet50 bf16 channels-last",
     ["--model", "resnet50", "--batch", "8", "--image", "64", "--precision", "bf16", "--channels-last"]),
    ("airbench94 fp16 channels-last",
     ["--model", "airbench94", "--batch", "64", "--image", "32", "--precision", "fp16", "--channels-last"]),
]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def largest_differences(c, t, n):
    names = set(c) | set(t)
    diff = sorted(names, key=lambda k: -abs(c.get(k, 0) - t.get(k, 0)))
    return [{"op": k, "cohort": c.get(k, 0), "torch": t.get(k, 0)} for k in diff[:n] if c.get(k, 0) != t.get(k, 0)]


def compare(cohort_bin, python, args, steps, device):
    common = ["--device", device, "--steps", str(steps), "--warmup", "2", "--count-ops"] + args
    c = run([cohort_bin] + common)
    t = run([python, PEER] + common)
    row = {"cohort_torch": c["torch"], "peer_torch": t["torch"]}
    for key in ("top_level_ops_per_step", "ops_per_step"):
        row[key] = {"cohort": c[key], "torch": t[key], "ratio": round(c[key] / t[key], 3)}
    row["top_level_differences"] = largest_differences(c["top_level_ops_per_step_by_name"],
                                                       t["top_level_ops_per_step_by_name"], 8)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", action="append", default=[],
                    help="LABEL=COHORT_BENCH,PYTHON (repeatable); default: Debian's 1.13 and pip's 2.14.1")
    ap.add_argument("--steps", type=int, default=5, help="counted steps of each (the count is per step)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    pairs = a.pair or [f"1.13=build/bench/gpu_train_step,/usr/bin/python3",
                       f"2.14=build-cuda/bench/gpu_train_step,{REFERENCE_PY}"]
    res = {"bench": f"ATen operator calls per training step on the {a.device}, cohort / torch", "steps": a.steps,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "pairs": {}}
    for pair in pairs:
        label, rest = pair.split("=", 1)
        cohort_bin, python = rest.split(",", 1)
        cohort_bin = os.path.join(ROOT, cohort_bin) if not os.path.isabs(cohort_bin) else cohort_bin
        python = shutil.which(python) or python
        if not os.path.exists(cohort_bin) or not os.path.exists(python):
            res["pairs"][label] = {"skipped": f"missing {cohort_bin if not os.path.exists(cohort_bin) else python}"}
            continue
        cases = CUDA_CASES if a.device == "cuda" else CASES
        res["pairs"][label] = {name: compare(cohort_bin, python, args, a.steps, a.device) for name, args in cases}
    emit(res, a.out)


if __name__ == "__main__":
    main()
