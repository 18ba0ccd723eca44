#!/usr/bin/env python3
"""Step time of zero1, zero2 and fsdp against ddp in the same run, and PyTorch's DDP and DDP +
ZeroRedundancyOptimizer (its ZeRO-1) as the peer. FSDP has no PyTorch peer on this machine: PyTorch
1.13's Gloo process group has no reduce_scatter, which torch's FSDP needs.

Same model on both sides (ResNet-8, width 32, Fashion-MNIST), AdamW, per-worker batch 128, 2 workers
with 1 thread each. Rounds are interleaved and the median taken, since this machine is shared.
Prints JSON; --out also writes it.
Run: make bench   (or: python3 bench/sharded_step.py --cohort build/cohort --steps 50 --rounds 2)"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 5


def run_cohort(a, strategy):
    d = tempfile.mkdtemp(prefix="cohort-bench-")
    cmd = [a.cohort, "train", "--nproc-per-node", "2", "--run-dir", d, f"train.max_steps={a.steps}",
           "eval.enabled=false", "train.threads=1", f"data.batch_size={a.batch}", "log.every_steps=1",
           "ckpt.save_best=false", "optim.name=adamw", "optim.lr=0.002", f"dist.strategy={strategy}", "log.progress=off",
           "amp.precision=fp32", "train.channels_last=false"]  # the peer runs fp32, contiguous
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("cohort failed: " + p.stderr.decode()[-2000:])
    # Steady state: images/s between the end of the warmup steps and the last step.
    recs = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    train = {r["step"]: r["train_seconds"] for r in recs if r.get("kind") == "train"}
    return (a.steps - WARMUP) * 2 * a.batch / (train[a.steps] - train[WARMUP])


def run_peer(a, mode, port):
    p = subprocess.run([a.python, os.path.join(HERE, "peer_torch_zero.py"), mode, str(a.steps), str(a.batch),
                        str(WARMUP), str(port)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("peer failed: " + p.stderr.decode()[-2000:])
    return json.loads(p.stdout.decode().strip().splitlines()[-1])["images_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (its torch)")
    ap.add_argument("--out")
    a = ap.parse_args()
    names = ["cohort_ddp", "cohort_zero1", "cohort_zero2", "cohort_fsdp", "pytorch_ddp", "pytorch_zero1"]
    ips = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names:
            if n.startswith("cohort_"):
                ips[n].append(run_cohort(a, n.split("_")[1]))
            else:
                ips[n].append(run_peer(a, "zero" if n.endswith("zero1") else "ddp", 29700 + r))
            print(n, round(ips[n][-1], 1), file=sys.stderr)
    med = {n: statistics.median(v) for n, v in ips.items()}
    res = {"benchmark": "sharded_step", "machine": {"cores": os.cpu_count()}, "model": "resnet8 w32, fashion-mnist",
           "optimizer": "adamw", "workers": 2, "threads_per_worker": 1, "batch_per_worker": a.batch,
           "steps": a.steps, "warmup_steps": WARMUP, "rounds": a.rounds, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "images_per_s_median": {n: round(v, 1) for n, v in med.items()},
           "images_per_s_all": {n: [round(x, 1) for x in v] for n, v in ips.items()},
           "cohort_over_cohort_ddp": {s: round(med["cohort_" + s] / med["cohort_ddp"], 3) for s in ("zero1", "zero2", "fsdp")},
           "pytorch_zero1_over_pytorch_ddp": round(med["pytorch_zero1"] / med["pytorch_ddp"], 3),
           "cohort_zero1_over_pytorch_zero1": round(med["cohort_zero1"] / med["pytorch_zero1"], 3),
           "cohort_ddp_over_pytorch_ddp": round(med["cohort_ddp"] / med["pytorch_ddp"], 3),
           "command": "python3 bench/sharded_step.py --cohort build/cohort --steps %d --rounds %d" % (a.steps, a.rounds)}
    print(json.dumps(res, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            f.write(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
