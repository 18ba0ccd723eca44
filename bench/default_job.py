#!/usr/bin/env python3
"""The default job, fast by default: cohort's `cohort train` (no arguments: ResNet-8 on Fashion-MNIST,
2 workers, 3 epochs, amp.precision=auto and train.channels_last=auto) against PyTorch DDP at its
defaults (fp32, contiguous: ../shared/peers/torch_ddp_fmnist.py's step), and like for like, cohort and
PyTorch with the same precision and layout, all in one run on the same LibTorch (Debian's python3-torch
is the LibTorch cohort links).

  time_to_accuracy   full 3-epoch runs: training time and test top-1 of each; the ratio is cohort's time
                     over PyTorch's (the issue asks for at most 0.5 with at least 91% on both sides).
  like_for_like      --steps steps of each (no evaluation), fp32 contiguous and bf16 channels-last,
                     --rounds interleaved rounds: median images/s ratio cohort / PyTorch per setting.
Prints JSON; --out also writes it. Run: make bench (or python3 bench/default_job.py --cohort build/cohort)."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

from benchlib import emit

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peers", "torch_ddp_fmnist_amp.py")


def run_cohort(a, extra):
    run_dir = tempfile.mkdtemp(prefix="cohort-default-job-")
    cmd = [a.cohort, "train", "--run-dir", run_dir, "ckpt.save_best=false"] + extra
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    out = p.stdout.decode()
    if p.returncode != 0:
        sys.exit("cohort failed: " + " ".join(cmd) + "\n" + out[-3000:])
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    first = next((l for l in out.splitlines() if l.startswith("cohort: ") and "worker(s)" in l), "")
    return {"args": extra, "train_s": round(s["train_seconds"], 2), "wall_s": round(wall, 2),
            "images_per_s": round(s["images_per_second"], 1), "test_acc": s["test_accuracy"],
            "precision": s["precision"], "channels_last": s.get("channels_last"),
            "auto": s.get("auto"), "time_share": {k: round(v, 4) for k, v in s["time_breakdown"]["share"].items()},
            "first_line": first}


def run_peer(a, flags, epochs, limit_steps=0):
    cmd = [a.python, PEER, "--nproc", "2", "--epochs", str(epochs), "--threads", "1",
           "--limit-steps", str(limit_steps), "--port", str(a.port)] + flags
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit("peer failed: " + " ".join(cmd) + "\n" + p.stderr.decode()[-3000:])
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    r["wall_s"] = round(wall, 2)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--steps", type=int, default=120, help="steps of each like-for-like run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved like-for-like rounds (medians)")
    ap.add_argument("--port", type=int, default=29561)
    ap.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (its torch)")
    ap.add_argument("--skip-full", action="store_true", help="only the like-for-like runs")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch  # the peer's version, for the record
    res = {"machine": {"cores": os.cpu_count()}, "torch": torch.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "job": "resnet8 w32, Fashion-MNIST, 2 workers x batch 128, 1 thread each, 3 epochs"}
    if not a.skip_full:
        c = run_cohort(a, [])
        p = run_peer(a, [], epochs=3)
        res["time_to_accuracy"] = {"cohort_defaults": c, "pytorch_ddp_defaults": p,
                                   "time_ratio_cohort_over_pytorch": round(c["train_s"] / p["train_s"], 3)}
    lfl = {}
    for name, cohort_args, peer_flags in (
            ("fp32_contiguous", ["amp.precision=fp32", "train.channels_last=false"], []),
            ("bf16_channels_last", ["amp.precision=bf16", "train.channels_last=true"], ["--bf16", "--channels-last"])):
        cs, ps = [], []
        for _ in range(a.rounds):  # interleaved, medians: the machine is shared and drifts
            cs.append(run_cohort(a, cohort_args + [f"train.max_steps={a.steps}", "eval.enabled=false", "train.epochs=1"]))
            ps.append(run_peer(a, peer_flags, epochs=1, limit_steps=a.steps))
        c_ips = statistics.median(c["images_per_s"] for c in cs)
        p_ips = statistics.median(p["images_per_s"] for p in ps)
        lfl[name] = {"rounds": a.rounds, "cohort_images_per_s": c_ips, "pytorch_images_per_s": p_ips,
                     "cohort_each": [c["images_per_s"] for c in cs], "pytorch_each": [p["images_per_s"] for p in ps],
                     "ratio_cohort_over_pytorch": round(c_ips / p_ips, 3), "cohort_time_share": cs[-1]["time_share"]}
    res["like_for_like"] = lfl
    emit(res, a.out)


if __name__ == "__main__":
    main()
