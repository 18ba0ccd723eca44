#!/usr/bin/env python3
"""The default job, fast by default: cohort's `cohort train` (no arguments: ResNet-8 on Fashion-MNIST,
2 workers, 2.7 epochs at lr 1.2, amp.precision=auto and train.channels_last=auto) against PyTorch DDP at
its defaults (3 epochs, fp32, contiguous: ../shared/peers/torch_ddp_fmnist.py's step), and like for like, cohort and
PyTorch with the same precision and layout, all in one run on the same LibTorch (Debian's python3-torch
is the LibTorch cohort links).

  time_to_accuracy   full runs (each side's own epochs) over --seeds seeds (the peer's --seed, cohort's train.seed), the
                     sides alternating: training time and test top-1 of each, their means and spread,
                     the ratio of mean training times (cohort / PyTorch) and the accuracy difference
                     against its noise (the standard error of the difference of the means).
  like_for_like      --steps steps of each (no evaluation), fp32 contiguous and bf16 channels-last
                     (--settings), --rounds interleaved rounds: median images/s ratio cohort / PyTorch
                     per setting, and each side's MFU: the same FLOPs per image (cohort's count, which
                     make test-reference holds within 2% of torch.utils.flop_counter's) times its
                     images/s, over the same peak (cohort's measured one for this CPU, dtype and thread
                     count; summary.json's peak_source), so the MFU ratio is the throughput ratio.
Prints JSON; --out also writes it. Run: make bench (or python3 bench/default_job.py --cohort build/cohort)."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

from benchlib import emit, machine

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
            "flops_per_image": s.get("flops_per_image"), "peak_tflops_per_worker": s.get("peak_tflops_per_worker"),
            "peak_source": s.get("peak_source"), "mfu": s.get("mfu"), "first_line": first}


def run_peer(a, flags, epochs, limit_steps=0, seed=0):
    cmd = [a.python, PEER, "--nproc", "2", "--epochs", str(epochs), "--threads", "1",
           "--limit-steps", str(limit_steps), "--port", str(a.port), "--seed", str(seed)] + flags
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
    ap.add_argument("--seeds", type=int, default=3, help="full runs of each side, seeds 0 .. N-1")
    ap.add_argument("--skip-like-for-like", action="store_true", help="only the full runs")
    ap.add_argument("--settings", default="fp32_contiguous,bf16_channels_last",
                    help="the like-for-like settings to run, comma-separated")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch  # the peer's version, for the record
    res = {"machine": machine(), "torch": torch.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "job": "resnet8 w32, Fashion-MNIST, 2 workers x batch 128, 1 thread each; each side's own "
           "epochs and recipe (cohort's defaults, the peer's 3 epochs)"}
    if not a.skip_full:
        res["time_to_accuracy"] = time_to_accuracy(a)
    if not a.skip_like_for_like:
        res["like_for_like"] = like_for_like(a)
    emit(res, a.out)


def spread(values):
    return {"mean": statistics.mean(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
            "each": values}


def time_to_accuracy(a):
    cs, ps = [], []
    for seed in range(a.seeds):  # alternating, so drift in the machine hits both sides alike
        cs.append(run_cohort(a, [f"train.seed={seed}"]))
        ps.append(run_peer(a, [], epochs=3, seed=seed))
    c_acc, p_acc = spread([c["test_acc"] for c in cs]), spread([p["test_acc"] for p in ps])
    c_s, p_s = spread([c["train_s"] for c in cs]), spread([p["train_s"] for p in ps])
    noise = (c_acc["stdev"] ** 2 / len(cs) + p_acc["stdev"] ** 2 / len(ps)) ** 0.5
    return {"seeds": a.seeds, "cohort_defaults": cs, "pytorch_ddp_defaults": ps,
            "cohort_test_acc": c_acc, "pytorch_test_acc": p_acc, "cohort_train_s": c_s, "pytorch_train_s": p_s,
            "time_ratio_cohort_over_pytorch": round(c_s["mean"] / p_s["mean"], 3),
            "accuracy_difference": round(c_acc["mean"] - p_acc["mean"], 5),
            "accuracy_difference_standard_error": round(noise, 5)}


def like_for_like(a):
    lfl = {}
    for name, cohort_args, peer_flags in (
            ("fp32_contiguous", ["amp.precision=fp32", "train.channels_last=false"], []),
            ("bf16_channels_last", ["amp.precision=bf16", "train.channels_last=true"], ["--bf16", "--channels-last"])):
        if name not in a.settings.split(","):
            continue
        cs, ps = [], []
        for _ in range(a.rounds):  # interleaved, medians: the machine is shared and drifts
            cs.append(run_cohort(a, cohort_args + [f"train.max_steps={a.steps}", "eval.enabled=false", "train.epochs=1"]))
            ps.append(run_peer(a, peer_flags, epochs=1, limit_steps=a.steps))
        c_ips = statistics.median(c["images_per_s"] for c in cs)
        p_ips = statistics.median(p["images_per_s"] for p in ps)
        lfl[name] = {"rounds": a.rounds, "cohort_images_per_s": c_ips, "pytorch_images_per_s": p_ips,
                     "cohort_each": [c["images_per_s"] for c in cs], "pytorch_each": [p["images_per_s"] for p in ps],
                     "ratio_cohort_over_pytorch": round(c_ips / p_ips, 3), "cohort_time_share": cs[-1]["time_share"]}
        flops, peak = cs[-1]["flops_per_image"], cs[-1]["peak_tflops_per_worker"]
        if flops and peak:
            mfu = lambda ips: round(flops * ips / (peak * 1e12 * 2), 4)  # 2 workers
            lfl[name].update({"flops_per_image": flops, "peak_tflops_per_worker": peak,
                              "peak_source": cs[-1]["peak_source"], "cohort_mfu": mfu(c_ips), "pytorch_mfu": mfu(p_ips)})
    return lfl


if __name__ == "__main__":
    main()
