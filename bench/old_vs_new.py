#!/usr/bin/env python3
"""Two cohort builds side by side in one run: steady-state images/s of ddp, zero1, zero2 and fsdp (the
sharded_step.py workload: ResNet-8 width 32, Fashion-MNIST, AdamW, 2 workers with 1 thread each, fp32),
rounds interleaved and medians taken, since this machine is shared. For a refactor that must not change
speed: the ratio new/old per strategy should be 1 within noise.
Prints JSON; --out also writes it.
Run: python3 bench/old_vs_new.py --old OLD/cohort --new build/cohort --out bench/results/old_vs_new.json"""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sharded_step  # noqa: E402  (its run_cohort is the workload)


def version(binary):
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strategies", default="ddp,zero1,zero2,fsdp")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for strategy in a.strategies.split(","):
        runs = {"old": [], "new": []}
        for r in range(a.rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                args = argparse.Namespace(cohort=getattr(a, side), steps=a.steps, batch=a.batch)
                runs[side].append(sharded_step.run_cohort(args, strategy))
        old, new = statistics.median(runs["old"]), statistics.median(runs["new"])
        rows.append({"strategy": strategy, "old_images_per_s": round(old, 1), "new_images_per_s": round(new, 1),
                     "new_over_old": round(new / old, 3), "runs": runs})
    out = {"old": {"binary": a.old, "version": version(a.old)}, "new": {"binary": a.new, "version": version(a.new)},
           "rounds": a.rounds, "steps": a.steps, "per_worker_batch": a.batch, "results": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
