#!/usr/bin/env python3
"""cohort's DistributedSampler against torch.utils.data.DistributedSampler of the reference environment's
PyTorch: the same indices on every rank over a grid of dataset sizes, world sizes, seeds, epochs, shuffle
and drop_last (the padding and the dropped tail included).

  sampler.py TOOL        TOOL: the cohort_reference_tool binary
"""
import json
import subprocess
import sys

import torch
from torch.utils.data import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def torch_indices(c):
    out = []
    for rank in range(c["world"]):
        s = DistributedSampler(Sized(c["n"]), num_replicas=c["world"], rank=rank, shuffle=c["shuffle"],
                               seed=c["seed"], drop_last=c["drop_last"])
        s.set_epoch(c["epoch"])
        out.append(list(iter(s)))
    return out


def main():
    cases = [dict(n=n, world=w, shuffle=sh, drop_last=dl, seed=seed, epoch=epoch)
             for n in (1, 7, 10, 33, 1000, 60000) for w in (1, 2, 3, 8) for sh in (False, True)
             for dl in (False, True) for seed, epoch in ((0, 0), (0, 3), (1234, 1))
             if not (dl and n < w)]  # cohort refuses that one: no sample for any rank
    out = subprocess.run([sys.argv[1], "sampler"], input="".join(json.dumps(c) + "\n" for c in cases),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    if len(out) != len(cases):
        sys.exit(f"FAILED: {len(out)} answers to {len(cases)} cases")
    for c, line in zip(cases, out):
        got, want = json.loads(line), torch_indices(c)
        if got != want:
            bad = next(r for r in range(c["world"]) if got[r] != want[r])
            sys.exit(f"FAILED: {c}, rank {bad}:\n cohort {got[bad][:12]}...\n torch  {want[bad][:12]}...")
    print(f"sampler: {len(cases)} cases, every rank equal to torch {torch.__version__}'s DistributedSampler")


if __name__ == "__main__":
    main()
