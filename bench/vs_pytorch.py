#!/usr/bin/env python3
"""cohort against today's PyTorch, in one run: every comparison side by side with its PyTorch peer running
in the reference environment (scripts/pip-libtorch: torch 2.14, torchvision 0.29), with cohort built
against that same LibTorch (the CUDA build of scripts/check-cuda, which runs on the CPU: the same kernels
as the peer, so the ratio is cohort's own) and, beside it, the Debian build a newcomer gets (LibTorch 1.13).

  ddp       the default job's model and data (ResNet-8, Fashion-MNIST, 2 workers x 128, 1 thread each),
            fp32 contiguous: cohort's ddp against torch DDP (bench/peers/torch_ddp_fmnist_amp.py)
  bf16      the same with bf16 autocast and channels-last on both sides, and what bf16 gains over fp32 on
            each LibTorch (this CPU has AVX-512 BF16 and AMX)
  zero1     AdamW, cohort's zero1 against DDP + ZeroRedundancyOptimizer (bench/peer_torch_zero.py)
  fsdp      AdamW, cohort's fsdp (a unit per residual block) against FSDP2 `fully_shard` per block, Gloo
  powersgd  ResNet-18 over a 100 Mbit/s link between two network namespaces (root only, as
            bench/slow_network.py): dist.compress=powersgd rank 2 against torch's powerSGD_hook
  jpeg      the ImageNet JPEG input pipeline (bench/input_pipeline.py) against torchvision 0.29 + PIL;
            the cohort side links no LibTorch, so it has one figure
  full      (--full) the default job end to end at each side's defaults: training time to test accuracy

Each comparison runs its sides in interleaved rounds (this machine is shared and drifts) and reports the
median and the ratio cohort / PyTorch per cohort build, each figure with its LibTorch version.
Prints JSON; --out also writes it.
Run: make bench, or
  python3 bench/vs_pytorch.py --python ~/.cache/cohort/torch-2.14.1/bin/python \\
      --cohort build-cuda/cohort --cohort build/cohort --pipeline build/bench/input_pipeline --full"""
import argparse, copy, json, os, re, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import default_job, sharded_step, slow_network  # noqa: E402  (the single-peer benches whose runs are reused)
from benchlib import emit  # noqa: E402


def libtorch_of(cohort):
    """The LibTorch a cohort binary was built against, from `cohort --version`."""
    out = subprocess.run([cohort, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"LibTorch ([0-9.]+)", out)
    if not m:
        sys.exit(f"{cohort} --version does not name its LibTorch: {out.strip()}")
    return m.group(1)


def torch_of(python):
    out = subprocess.run([python, "-c", "import torch, torchvision; print(torch.__version__, torchvision.__version__)"],
                         check=True, capture_output=True, text=True).stdout.split()
    return {"torch": out[0], "torchvision": out[1]}


def default_job_ips(a, cohort_args, peer_flags):
    """The like-for-like run of bench/default_job.py: images/s of a fixed number of steps, no evaluation."""
    steps = [f"train.max_steps={a.steps}", "eval.enabled=false", "train.epochs=1"]

    def run(side):
        if side["kind"] == "cohort":
            return default_job.run_cohort(side["args"], cohort_args + steps)["images_per_s"]
        return default_job.run_peer(side["args"], peer_flags, epochs=1, limit_steps=a.steps)["images_per_s"]
    return run


def sharded_ips(a, strategy, peer_mode):
    def run(side):
        if side["kind"] == "cohort":
            return sharded_step.run_cohort(side["args"], strategy)
        return sharded_step.run_peer(side["args"], peer_mode, a.port + 1)
    return run


def powersgd_step_s(a, peer_failures):
    """torch 2.14's powerSGD_hook over Gloo sometimes dies with "Received data size doesn't match expected
    size" (one rank in another all-reduce than the other; 2 runs in 6 here): such a run is retried,
    up to 3 times, and counted in peer_failures."""
    def run(side):
        if side["kind"] == "cohort":
            extra = ["dist.compress=powersgd", "powersgd.rank=2", "powersgd.start_iter=0"]
            return slow_network.run(side["args"], "powersgd", extra, a.port + 2)["step_seconds"]
        for attempt in range(3):
            try:
                return slow_network.run_peer(side["args"], "powersgd", a.port + 3 + attempt)
            except SystemExit as e:
                peer_failures.append(str(e).splitlines()[0] + " " + next(
                    (l.strip() for l in str(e).splitlines() if "Received data size" in l or "what()" in l), ""))
                print(f"powersgd: PyTorch's run failed (attempt {attempt + 1}), retrying", file=sys.stderr)
        sys.exit("powersgd: PyTorch's powerSGD_hook failed 3 times in a row")
    return run


def full_job(sides):
    """The default job at each side's defaults (cohort's 2.7 epochs since 2026-12-01, the peer's 3), with
    evaluation: training seconds and test accuracy."""
    runs = {}
    for s in sides:
        r = default_job.run_cohort(s["args"], []) if s["kind"] == "cohort" else default_job.run_peer(s["args"], [], epochs=3)
        runs[s["label"]] = {"train_s": r["train_s"], "test_acc": r["test_acc"], "precision": r.get("precision", "fp32")}
        print(f"full {s['label']}: {runs[s['label']]}", file=sys.stderr)
    peer = runs[sides[-1]["label"]]["train_s"]
    return {"runs": runs, "time_ratio_cohort_over_pytorch": {k: round(v["train_s"] / peer, 3) for k, v in runs.items()
                                                            if k != sides[-1]["label"]}}


def compare(name, sides, run, rounds, higher_is_better=True):
    """Interleaved rounds of every side; medians and cohort / PyTorch speed ratios (>1: cohort is faster)."""
    each = {s["label"]: [] for s in sides}
    for r in range(rounds):
        for s in sides:
            each[s["label"]].append(run(s))
            print(f"{name} round {r + 1} {s['label']}: {each[s['label']][-1]}", file=sys.stderr)
    med = {k: round(statistics.median(v), 3) for k, v in each.items()}
    peer = next(s["label"] for s in sides if s["kind"] == "pytorch")
    speed = (lambda c: med[c] / med[peer]) if higher_is_better else (lambda c: med[peer] / med[c])
    return {"median": med, "each": {k: [round(x, 3) for x in v] for k, v in each.items()},
            "unit": "images/s" if higher_is_better else "seconds per step",
            "speed_cohort_over_pytorch": {c: round(speed(c), 3) for c in med if c != peer}}


def with_args(sides, **changes):
    """The sides with some benchmark arguments changed (each side keeps its own binary)."""
    return [{**s, "args": argparse.Namespace(**{**vars(s["args"]), **changes})} for s in sides]


def jpeg_pipeline(a, versions):
    """bench/input_pipeline.py with the reference environment's torchvision as the peer."""
    out = tempfile.mktemp(prefix="cohort-vs-pytorch-jpeg-", suffix=".json")
    subprocess.run([sys.executable, os.path.join(HERE, "input_pipeline.py"), "--bench", a.pipeline, "--python", a.python,
                    "--rounds", str(a.rounds + 1), "--out", out], check=True, stdout=subprocess.DEVNULL)
    r = json.load(open(out))
    os.remove(out)
    return {"images_per_s": r["images_per_s"], "speed_cohort_over_torchvision_per_core": r["ratio_cohort_over_torchvision_per_core"],
            "torchvision_versions": r["torchvision_versions"], "work": r["work"],
            "note": "cohort's pipeline (libjpeg-turbo, its own resize) links no LibTorch; torchvision " +
                    versions["torchvision"] + " runs with PIL, one process per worker"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="the reference environment's python (torch 2.14)")
    ap.add_argument("--cohort", action="append", required=True, help="a cohort binary; repeat for each build")
    ap.add_argument("--pipeline", help="build/bench/input_pipeline (the jpeg comparison; left out without it)")
    ap.add_argument("--steps", type=int, default=120, help="steps of each default-job run")
    ap.add_argument("--shard-steps", type=int, default=50, help="steps of each zero1 and fsdp run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="ddp,bf16,zero1,fsdp,powersgd,jpeg", help="comma-separated comparisons")
    ap.add_argument("--full", action="store_true", help="also the default job end to end (about 10 minutes)")
    ap.add_argument("--port", type=int, default=29761)
    ap.add_argument("--out")
    a = ap.parse_args()
    versions = torch_of(a.python)
    only = set(a.only.split(","))
    base = argparse.Namespace(python=a.python, port=a.port, steps=a.shard_steps, batch=128)
    sides = []
    for path in a.cohort:
        path = os.path.abspath(path)
        lt = libtorch_of(path)
        sides.append({"kind": "cohort", "label": f"cohort (LibTorch {lt})", "libtorch": lt, "binary": path,
                      "args": argparse.Namespace(**{**vars(base), "cohort": path})})
    sides.append({"kind": "pytorch", "label": f"PyTorch {versions['torch']}", "libtorch": versions["torch"],
                  "binary": a.python, "args": copy.copy(base)})
    res = {"bench": "vs_pytorch", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cores": os.cpu_count(),
           "peer": versions, "sides": {s["label"]: {"libtorch": s["libtorch"], "binary": s["binary"]} for s in sides},
           "rounds": a.rounds, "command": "python3 " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
           "comparisons": {}}
    job = "resnet8 w32, Fashion-MNIST, 2 workers x batch 128, 1 thread each"
    cmp = res["comparisons"]
    if "ddp" in only:
        cmp["ddp"] = {"what": f"{job}, {a.steps} steps, fp32 contiguous: ddp against torch DDP",
                      **compare("ddp", sides, default_job_ips(a, ["amp.precision=fp32", "train.channels_last=false"], []), a.rounds)}
    if "bf16" in only:
        cmp["bf16"] = {"what": f"{job}, {a.steps} steps, bf16 autocast, channels-last, on both sides",
                       **compare("bf16", sides, default_job_ips(a, ["amp.precision=bf16", "train.channels_last=true"],
                                                                ["--bf16", "--channels-last"]), a.rounds)}
        if "ddp" in cmp:
            cmp["bf16"]["gain_over_fp32"] = {k: round(v / cmp["ddp"]["median"][k], 3) for k, v in cmp["bf16"]["median"].items()}
    if "zero1" in only:
        cmp["zero1"] = {"what": f"{job}, AdamW, {a.shard_steps} steps (5 warm-up): zero1 against DDP + ZeroRedundancyOptimizer",
                        **compare("zero1", sides, sharded_ips(a, "zero1", "zero"), a.rounds)}
    if "fsdp" in only:
        cmp["fsdp"] = {"what": f"{job}, AdamW, {a.shard_steps} steps (5 warm-up): fsdp (unit: block) against FSDP2 "
                               "fully_shard per block and the root",
                       **compare("fsdp", sides, sharded_ips(a, "fsdp", "fsdp"), a.rounds)}
    if "powersgd" in only:
        if os.geteuid() != 0:
            cmp["powersgd"] = {"skipped": "needs root for ip netns and tc (bench/slow_network.py)"}
        else:
            failures = []
            try:
                slow_network.setup("100mbit")
                cmp["powersgd"] = {"what": "resnet18 on Fashion-MNIST, 2 machines (network namespaces) over tc tbf "
                                           "100mbit, batch 64, 8 steps: powersgd rank 2 against torch's powerSGD_hook",
                                   **compare("powersgd", with_args(sides, steps=8, batch=64),
                                             powersgd_step_s(a, failures), a.rounds, higher_is_better=False),
                                   "pytorch_failed_runs": failures}
            finally:
                slow_network.teardown()
    if "jpeg" in only and a.pipeline:
        cmp["jpeg"] = jpeg_pipeline(a, versions)
    if a.full:
        cmp["full"] = {"what": f"{job}, with evaluation, each side at its defaults (cohort: auto precision "
                               "and layout, 2.7 epochs since 2026-12-01; PyTorch: fp32 contiguous, 3 epochs)", **full_job(sides)}
    emit(res, a.out)


if __name__ == "__main__":
    main()
