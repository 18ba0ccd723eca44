#!/usr/bin/env python3
"""The MFU of the ready configs (configs/*.toml) on this machine, next to PyTorch's for the same work, in
one run: `cohort train --config X` on 2 workers x 1 thread (its default launch on a 2-core machine)
against PyTorch DDP on 2 workers x 1 thread (bench/peers/torch_ddp_train_step.py, Debian's python3-torch:
the LibTorch cohort's default build links, so the ratio is cohort's own).

What is the same on both sides: the model (cohort's and torchvision's ResNet-50 and ViT-B/32, the
CIFAR ResNet-20 and airbench94 written out in the peer), the batch per worker and image size, and the
precision and layout `auto` chose for the config on this machine (read from cohort's summary.json and
given to the peer). What differs, and is the config's own cost on cohort's side: its optimizer details
(airbench's lookahead and per-group rates, the schedules), and reading the batch from CIFAR-10-format
files made here (random pixels; data.augment=false, resized in the batch to the image size), where the
peer keeps one random batch in memory. Sizes are cut to what 2 cores run in minutes (--quick cuts them
more): ResNet-50 and ViT-B/32 at 224 pixels keep their per-image cost, their batch is smaller.

MFU = images/s x FLOPs per image / (workers x peak per worker). Both sides use cohort's FLOP count (make
test-reference holds it within 2% of torch.utils.flop_counter's for every model) and cohort's measured
peak for this CPU, precision and thread count (summary.json's peak_source), so each MFU ratio is the
throughput ratio. Timed: the steps after --warmup ones (cohort: metrics.jsonl's train_seconds at those
steps; the peer: between two barriers); sides interleaved --rounds times, medians.
Prints JSON; --out also writes it. Run: /usr/bin/python3 bench/configs_mfu.py --cohort build/cohort"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

from benchlib import emit, machine
from resnet50_cpu import fake_cifar  # random CIFAR-10-format files, n records in each

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
PEER = os.path.join(HERE, "peers", "torch_ddp_train_step.py")

# config: (peer model, image, batch per worker, timed steps, what the config says the batch is)
JOBS = {
    "cifar10_resnet.toml": ("resnet20", 32, 256, 20),
    "cifar10_airbench.toml": ("airbench94", 32, 256, 8),
    "cifar10_vit_b32_finetune.toml": ("vit_b32", 224, 16, 4),
    "imagenet_resnet50.toml": ("resnet50", 224, 16, 4),
}


def run_cohort(a, config, image, batch, steps):
    run_dir = tempfile.mkdtemp(prefix="cohort-configs-mfu-")
    total = a.warmup + steps
    cmd = [a.cohort, "train", "--config", os.path.join(ROOT, "configs", config), "--run-dir", run_dir,
           "--nproc-per-node", "2", "train.threads=1", "data.name=cifar10", f"data.root={a.data}",
           "model.num_classes=10", "model.pretrained=", f"data.image_size={image}", f"data.batch_size={batch}",
           "data.augment=false", "data.workers=1", "eval.enabled=false", "train.epochs=1000",
           f"train.max_steps={total}", "ckpt.save_best=false", "ckpt.every_steps=100000", "log.every_steps=1",
           "log.progress=off"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit("cohort failed: " + " ".join(cmd) + "\n" + p.stdout.decode()[-3000:])
    train = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if r.get("kind") == "train":
            train[r["step"]] = r["train_seconds"]
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    return {"images_per_s": steps * batch * 2 / (train[total] - train[a.warmup]), "precision": s["precision"],
            "channels_last": s.get("channels_last"), "flops_per_image": s.get("flops_per_image"),
            "peak_tflops_per_worker": s.get("peak_tflops_per_worker"), "peak_source": s.get("peak_source"),
            "summary_mfu": s.get("mfu"), "time_share": {k: round(v, 4) for k, v in s["time_breakdown"]["share"].items()}}


def run_peer(a, model, image, batch, steps, precision, channels_last):
    cmd = [a.python, PEER, "--workers", "2", "--threads", "1", "--port", str(a.port), "--model", model,
           "--image", str(image), "--batch", str(batch), "--classes", "10", "--steps", str(steps),
           "--warmup", str(a.warmup), "--precision", precision] + (["--channels-last"] if channels_last else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("peer failed: " + " ".join(cmd) + "\n" + p.stderr.decode()[-3000:])
    return json.loads(p.stdout.decode().strip().splitlines()[-1])["images_per_second"]


def compare(a, config, model, image, batch, steps):
    cs, ps = [], []
    for _ in range(a.rounds):  # interleaved: the machine is shared and drifts
        cs.append(run_cohort(a, config, image, batch, steps))
        c = cs[-1]
        ps.append(run_peer(a, model, image, batch, steps, c["precision"], bool(c["channels_last"])))
    c, c_ips, p_ips = cs[-1], statistics.median(x["images_per_s"] for x in cs), statistics.median(ps)
    res = {"model": model, "image": image, "batch_per_worker": batch, "timed_steps": steps,
           "precision": c["precision"], "channels_last": c["channels_last"],
           "cohort_images_per_s": round(c_ips, 2), "pytorch_images_per_s": round(p_ips, 2),
           "cohort_each": [round(x["images_per_s"], 2) for x in cs], "pytorch_each": [round(x, 2) for x in ps],
           "ratio_cohort_over_pytorch": round(c_ips / p_ips, 3), "cohort_time_share": c["time_share"],
           "flops_per_image": c["flops_per_image"], "peak_tflops_per_worker": c["peak_tflops_per_worker"],
           "peak_source": c["peak_source"], "cohort_summary_mfu": c["summary_mfu"]}
    if c["flops_per_image"] and c["peak_tflops_per_worker"]:
        mfu = lambda ips: round(c["flops_per_image"] * ips / (c["peak_tflops_per_worker"] * 1e12 * 2), 4)
        res.update({"cohort_mfu": mfu(c_ips), "pytorch_mfu": mfu(p_ips)})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (its torch)")
    ap.add_argument("--configs", default=",".join(JOBS), help="comma-separated, from configs/")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 2 timed steps, small batches")
    ap.add_argument("--port", type=int, default=29563)
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch  # the peer's version, for the record
    if a.quick:
        a.rounds = 1
    jobs = {k: JOBS[k] for k in a.configs.split(",")}
    a.data = tempfile.mkdtemp(prefix="cohort-configs-mfu-data-")
    need = max(2 * b * (a.warmup + s + 1) for _, _, b, s in jobs.values())
    fake_cifar(a.data, need // 5 + 1)
    res = {"machine": machine(), "torch": torch.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "workers": 2, "threads_per_worker": 1, "warmup_steps": a.warmup, "rounds": a.rounds, "configs": {}}
    for config, (model, image, batch, steps) in jobs.items():
        if a.quick:
            batch, steps = max(2, batch // 8), 2
        res["configs"][config] = compare(a, config, model, image, batch, steps)
        print(config, json.dumps(res["configs"][config]), file=sys.stderr, flush=True)
    emit(res, a.out)


if __name__ == "__main__":
    main()
