#!/usr/bin/env python3
"""DDP scaling on this machine, cohort next to PyTorch's DDP (../shared/peers/torch_ddp_fmnist.py).

Same model (ResNet-8, width 32), per-worker batch 128, 1 thread per worker, in one run:
  single      one worker alone
  ceiling     two independent single workers running at once (the compute this machine has for two)
  ddp         two workers with DDP
DDP efficiency = ddp images/s / ceiling images/s, reported for both. Prints JSON; --out also writes it.
Run: make bench   (or: python3 bench/ddp_scaling.py --cohort build/cohort --steps 60)"""
import argparse, json, os, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peers", "torch_ddp_fmnist.py"))


def cohort_cmd(a, nproc, run_dir):
    return [a.cohort, "train", "--nproc-per-node", str(nproc), "--run-dir", run_dir, f"train.max_steps={a.steps}",
            "eval.enabled=false", "train.threads=1", f"data.batch_size={a.batch}", "log.every_steps=1000",
            "ckpt.save_best=false", "amp.precision=fp32", "train.channels_last=false"]  # the peer runs fp32, contiguous


def run_cohort(a, nproc, copies=1):
    dirs = [tempfile.mkdtemp(prefix="cohort-bench-") for _ in range(copies)]
    procs = [subprocess.Popen(cohort_cmd(a, nproc, d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for d in dirs]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit("cohort failed: " + err.decode()[-2000:])
    return sum(json.load(open(os.path.join(d, "summary.json")))["images_per_second"] for d in dirs)


def run_peer(a, nproc, copies=1):
    procs = [subprocess.Popen(["/usr/bin/python3", PEER, "--nproc", str(nproc), "--epochs", "1", "--batch", str(a.batch),
                               "--threads", "1", "--limit-steps", str(a.steps), "--port", str(29600 + i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(copies)]
    total = 0.0
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit("peer failed: " + err.decode()[-2000:])
        total += json.loads(out.decode().strip().splitlines()[-1])["images_per_s"]
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"machine": {"cores": os.cpu_count()}, "steps": a.steps, "batch_per_worker": a.batch, "model": "resnet8 w32",
           "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for name, fn in (("cohort", run_cohort), ("pytorch_ddp", run_peer)):
        single = fn(a, 1)
        ceiling = fn(a, 1, copies=2)
        ddp = fn(a, 2)
        res[name] = {"single_images_per_s": round(single, 1), "ceiling_images_per_s": round(ceiling, 1),
                     "ddp_images_per_s": round(ddp, 1), "ddp_efficiency": round(ddp / ceiling, 3)}
    res["cohort_ddp_over_pytorch_ddp"] = round(res["cohort"]["ddp_images_per_s"] / res["pytorch_ddp"]["ddp_images_per_s"], 3)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
