#!/usr/bin/env python3
"""cohort's C++ training step (bench/gpu_train_step) next to PyTorch in Python (bench/peers/torch_train_step.py)
on one GPU, in the same run: the two take the same arguments and print the same JSON, and run in turns for
--rounds rounds (the order swaps every round, so drift in clocks or temperature hits both alike). Medians
of the rounds and the cohort/torch ratio go to:
  gpu_resnet50.json  ResNet-50 on synthetic ImageNet-shaped batches, channels-last, per precision (fp16,
                     bf16): images/s, peak memory.
  gpu_airbench.json  airbench94 on a synthetic CIFAR-10-shaped dataset resident on the GPU: seconds for
                     --ab-epochs epochs at batch 1024, fp16.
scripts/gpu-check runs it on the GPU machine:
  python3 bench/gpu_compare.py --cohort-bench build-gpu/bench/gpu_train_step --out-dir bench/results
A CPU smoke run of the driver itself (the peer standing in for both sides):
  /usr/bin/python3 bench/gpu_compare.py --device cpu --cohort-bench "/usr/bin/python3 bench/peers/torch_train_step.py" \\
      --python /usr/bin/python3 --rounds 2 --r50-model resnet18 --r50-batch 2 --r50-image 32 --r50-steps 1 \\
      --r50-warmup 1 --precisions fp32 --ab-batch 8 --ab-dataset-size 16 --ab-epochs 1 --ab-precision fp32 \\
      --out-dir /tmp/gc
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--which", default="resnet50,airbench", help="comma list of resnet50, airbench")
    ap.add_argument("--cohort-bench", default="build-gpu/bench/gpu_train_step",
                    help="the C++ bench (a command line; split like a shell would)")
    ap.add_argument("--peer", default=os.path.join(HERE, "peers", "torch_train_step.py"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cuda-graph", action="store_true", help="pass --cuda-graph to both")
    ap.add_argument("--cohort-loop", action="store_true",
                    help="resnet50: also run cohort with --foreach false (the per-parameter optimizer loop) "
                         "in every round, as impl cohort_loop")
    ap.add_argument("--phases", action="store_true",
                    help="resnet50: after the rounds, one run of each impl with --phases (a sync after each "
                         "part of the step) per precision; the times per part go under \"phase_ms\"")
    ap.add_argument("--timeout", type=float, default=240, help="seconds one run may take")
    ap.add_argument("--deadline", type=float, default=0,
                    help="unix time after which no new run starts (0: none); skipped runs are reported")
    ap.add_argument("--r50-model", default="resnet50", help="resnet50 (resnet18 for smoke runs)")
    ap.add_argument("--r50-batch", type=int, default=256)
    ap.add_argument("--r50-image", type=int, default=224)
    ap.add_argument("--r50-classes", type=int, default=1000)
    ap.add_argument("--r50-steps", type=int, default=30)
    ap.add_argument("--r50-warmup", type=int, default=10)
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--ab-batch", type=int, default=1024)
    ap.add_argument("--ab-epochs", type=int, default=10)
    ap.add_argument("--ab-dataset-size", type=int, default=50000)
    ap.add_argument("--ab-precision", default="fp16")
    ap.add_argument("--ab-warmup", type=int, default=10)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--log-dir", default=None, help="per-run stdout/stderr (default: <out-dir>/../out/gpu-check)")
    return ap.parse_args()


def nvidia_smi():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if p.returncode == 0 and p.stdout.strip():
            name, driver, memory = [s.strip() for s in p.stdout.strip().splitlines()[0].split(",")]
            return {"name": name, "driver": driver, "memory_total": memory}
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


class Runner:
    def __init__(self, a):
        self.a = a
        self.log_dir = a.log_dir or os.path.join(a.out_dir, "..", "out", "gpu-check")
        os.makedirs(self.log_dir, exist_ok=True)
        self.failures = 0
        self.count = 0

    def command(self, impl, args):
        cohort = impl.startswith("cohort")
        base = shlex.split(self.a.cohort_bench) if cohort else [self.a.python, self.a.peer]
        extra = ["--device", self.a.device] + (["--cuda-graph"] if self.a.cuda_graph else [])
        if impl == "cohort_loop":
            extra += ["--foreach", "false"]
        return base + args + extra

    def run(self, impl, args, tag):
        """One run -> its JSON, or {"error": ...}."""
        cmd = self.command(impl, args)
        if self.a.deadline and time.time() > self.a.deadline:
            self.failures += 1
            return {"error": "skipped: out of time (--deadline)", "command": shlex.join(cmd)}
        if impl.startswith("cohort") and not os.path.exists(cmd[0]):
            self.failures += 1
            return {"error": f"{cmd[0]} not found (not built?)", "command": shlex.join(cmd)}
        self.count += 1
        log = os.path.join(self.log_dir, f"{tag}-{impl}-{self.count:02d}.log")
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.a.timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", e.stdout or "", (e.stderr or "") + f"\n[killed after {self.a.timeout} s]"
            out = out.decode() if isinstance(out, bytes) else out
            err = err.decode() if isinstance(err, bytes) else err
        with open(log, "w") as f:
            f.write(f"$ {shlex.join(cmd)}\n# rc {rc}, {time.time() - t0:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
        result = None
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                except json.JSONDecodeError:
                    pass
                break
        if rc != 0 or result is None:
            self.failures += 1
            tail = "\n".join((err or out).strip().splitlines()[-5:])
            print(f"gpu_compare: {impl} {tag} failed (rc {rc}); log {log}\n{tail}", file=sys.stderr)
            return {"error": f"rc {rc}: {tail[-500:]}", "command": shlex.join(cmd), "log": log}
        result["command"] = shlex.join(cmd)
        result["wall_seconds"] = round(time.time() - t0, 2)
        print(f"gpu_compare: {tag} {impl}: {result.get('images_per_second', 0):.1f} img/s, "
              f"{result.get('seconds', 0):.2f} s", file=sys.stderr)
        return result

    def rounds(self, args, tag, impls=("cohort", "torch")):
        """--rounds rounds of each impl, the order reversed every other round."""
        runs = {impl: [] for impl in impls}
        for r in range(self.a.rounds):
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                runs[impl].append(self.run(impl, args, tag))
        return runs


def summarize(runs, key):
    """Median of `key` over the rounds that worked; peak memory is the largest seen."""
    ok = [r for r in runs if "error" not in r and r.get(key) is not None]
    s = {"rounds": [r.get(key) for r in runs], "ok_rounds": len(ok)}
    if ok:
        s["median"] = statistics.median(r[key] for r in ok)
        mem = [r["peak_memory_bytes"] for r in ok if r.get("peak_memory_bytes") is not None]
        s["peak_memory_bytes"] = max(mem) if mem else None
        s["version"] = ok[0].get("torch")
        s["device"] = ok[0].get("device")
        s["command"] = ok[0].get("command")
        if ok[0].get("note"):
            s["note"] = ok[0]["note"]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        s["errors"] = errors
    return s


def ratio(a, b):
    return a["median"] / b["median"] if "median" in a and "median" in b and b["median"] else None


def header(a, smi, what):
    return {"bench": what, "device": (smi or {}).get("name") or a.device, "gpu": smi,
            "rounds": a.rounds, "cuda_graph": a.cuda_graph, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def bench_resnet50(a, runner, smi):
    out = header(a, smi, f"{a.r50_model} training step on synthetic ImageNet-shaped data, channels-last")
    out.update({"model": a.r50_model, "batch": a.r50_batch, "image": a.r50_image, "classes": a.r50_classes,
                "steps": a.r50_steps, "warmup": a.r50_warmup, "modes": {}})
    for precision in [p for p in a.precisions.split(",") if p]:
        args = ["--model", a.r50_model, "--batch", str(a.r50_batch), "--image", str(a.r50_image),
                "--classes", str(a.r50_classes), "--precision", precision, "--channels-last",
                "--steps", str(a.r50_steps), "--warmup", str(a.r50_warmup)]
        impls = ("cohort", "torch") + (("cohort_loop",) if a.cohort_loop else ())
        runs = runner.rounds(args, f"{a.r50_model}-{precision}", impls)
        c, t = summarize(runs["cohort"], "images_per_second"), summarize(runs["torch"], "images_per_second")
        mode = {"cohort_images_per_second": c, "torch_images_per_second": t,
                "ratio_cohort_over_torch": ratio(c, t)}
        if a.cohort_loop:
            loop = summarize(runs["cohort_loop"], "images_per_second")
            mode["cohort_loop_images_per_second"] = loop
            mode["ratio_cohort_loop_over_torch"] = ratio(loop, t)
        out["modes"][precision] = mode
        out.setdefault("torch_version", t.get("version"))
        out.setdefault("libtorch_version", c.get("version"))
    if a.phases:
        for precision in [p for p in a.precisions.split(",") if p]:
            args = ["--model", a.r50_model, "--batch", str(a.r50_batch), "--image", str(a.r50_image),
                    "--classes", str(a.r50_classes), "--precision", precision, "--channels-last",
                    "--steps", str(a.r50_steps), "--warmup", str(a.r50_warmup), "--phases"]
            impls = ("cohort", "torch") + (("cohort_loop",) if a.cohort_loop else ())
            phases = {}
            for impl in impls:
                r = runner.run(impl, args, f"{a.r50_model}-{precision}-phases")
                phases[impl] = r.get("phase_ms") or {"error": r.get("error", "no phase_ms in its JSON")}
            out["modes"][precision]["phase_ms"] = phases
    return out


def bench_airbench(a, runner, smi):
    out = header(a, smi, f"airbench94, {a.ab_epochs} epochs of a synthetic CIFAR-10-shaped dataset resident on the {'GPU' if a.device == 'cuda' else 'CPU'}")
    out.update({"model": "airbench94", "batch": a.ab_batch, "epochs": a.ab_epochs,
                "dataset_size": a.ab_dataset_size, "precision": a.ab_precision, "warmup": a.ab_warmup})
    args = ["--model", "airbench94", "--batch", str(a.ab_batch), "--image", "32", "--classes", "10",
            "--precision", a.ab_precision, "--channels-last", "--epochs", str(a.ab_epochs),
            "--dataset-size", str(a.ab_dataset_size), "--warmup", str(a.ab_warmup)]
    runs = runner.rounds(args, "airbench94")
    c, t = summarize(runs["cohort"], "seconds"), summarize(runs["torch"], "seconds")
    out.update({"cohort_seconds": c, "torch_seconds": t,
                # Below 1: cohort takes less time.
                "seconds_ratio_cohort_over_torch": ratio(c, t),
                "torch_version": t.get("version"), "libtorch_version": c.get("version")})
    return out


def main():
    a = parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    smi = nvidia_smi() if a.device == "cuda" else None
    runner = Runner(a)
    # --r50-model names another model (vit_b32): its own file, so the ResNet-50 figures stay.
    r50_file = "gpu_resnet50.json" if a.r50_model == "resnet50" else f"gpu_{a.r50_model}.json"
    benches = {"resnet50": (r50_file, bench_resnet50), "airbench": ("gpu_airbench.json", bench_airbench)}
    which = [w for w in a.which.split(",") if w]
    for w in which:
        if w not in benches:
            sys.exit(f"gpu_compare: unknown bench {w!r} (choose from {', '.join(benches)})")
    for w in which:
        name, fn = benches[w]
        result = fn(a, runner, smi)
        path = os.path.join(a.out_dir, name)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"gpu_compare: wrote {path}", file=sys.stderr)
    if runner.failures:
        sys.exit(f"gpu_compare: {runner.failures} run(s) failed or were skipped; see the JSON and {runner.log_dir}")


if __name__ == "__main__":
    main()
