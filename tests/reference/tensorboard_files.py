#!/usr/bin/env python3
"""cohort's TensorBoard event files read by TensorBoard itself (the `tensorboard` package of the reference
environment): its event reader returns every scalar of the run's metrics.jsonl at the same steps, and a
real `tensorboard --logdir` server on loopback serves them over its HTTP API.

  tensorboard_files.py COHORT WORKDIR
"""
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# metrics.jsonl field -> TensorBoard tag, per record kind.
TAGS = {
    "train": {"loss": "train/loss", "top1": "train/top1", "top5": "train/top5", "lr": "train/lr",
              "images_per_second": "train/images_per_second", "sync_bytes": "train/sync_bytes",
              "achieved_tflops": "train/achieved_tflops", "mfu": "train/mfu",
              "loss_scale": "amp/loss_scale"},
    "eval": {"test_loss": "val/loss", "test_top1": "val/top1", "test_top5": "val/top5"},
}


def expected(run_dir):
    """{tag: {step: value}} from metrics.jsonl."""
    want = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            for field, tag in TAGS.get(r["kind"], {}).items():
                if r.get(field) is not None:
                    want.setdefault(tag, {})[r["step"]] = float(r[field])
            if r["kind"] == "resources":
                for rank, (rss, cpu) in enumerate(zip(r["rss_bytes"], r["cpu_percent"])):
                    want.setdefault(f"memory/rss_mb/rank{rank}", {})[r["step"]] = rss / (1 << 20)
                    want.setdefault(f"cpu/percent/rank{rank}", {})[r["step"]] = float(cpu)
    return want


def check(what, got, want):
    """got, want: {tag: {step: value}}; values are float32 in the event file."""
    for tag, steps in want.items():
        if tag not in got:
            sys.exit(f"FAILED: {what}: no tag {tag} (has {sorted(got)})")
        if sorted(got[tag]) != sorted(steps):
            sys.exit(f"FAILED: {what}: {tag} at steps {sorted(got[tag])}, metrics.jsonl has {sorted(steps)}")
        for step, v in steps.items():
            if not math.isclose(got[tag][step], v, rel_tol=1e-6, abs_tol=1e-30):
                sys.exit(f"FAILED: {what}: {tag} step {step}: {got[tag][step]} != {v}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served(run_dir, tags):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", run_dir, "--host", "127.0.0.1",
                              "--port", str(port), "--load_fast", "false"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/data/plugin/scalars"
    try:
        deadline = time.time() + 120
        while True:
            try:
                listing = json.load(urllib.request.urlopen(f"{base}/tags", timeout=5))
                if listing and all(t in next(iter(listing.values())) for t in tags):
                    break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                sys.exit(f"FAILED: tensorboard did not serve the run's tags: {server.stderr.read()[-2000:] if server.poll() is not None else 'timeout'}")
            time.sleep(1)
        run = next(iter(listing))
        got = {}
        for tag in tags:
            q = urllib.parse.urlencode({"run": run, "tag": tag})
            rows = json.load(urllib.request.urlopen(f"{base}/scalars?{q}", timeout=30))
            got[tag] = {step: value for _, step, value in rows}
        return got
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    cohort, work = sys.argv[1], sys.argv[2]
    run_dir = os.path.join(work, "run")
    p = subprocess.run([cohort, "train", "--nproc-per-node", "2", "--run-dir", run_dir, "train.epochs=2",
                        "data.train_limit=1024", "data.test_limit=256", "data.batch_size=64", "log.every_steps=2",
                        "amp.precision=fp16"], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"FAILED: cohort train: {p.stderr[-3000:]}")
    want = expected(run_dir)
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    got = {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
    check("EventAccumulator", got, want)
    print(f"EventAccumulator: {len(want)} tags, {sum(map(len, want.values()))} scalars equal to metrics.jsonl")
    check("tensorboard server", served(run_dir, list(want)), want)
    print(f"tensorboard --logdir: serves the same {len(want)} tags over /data/plugin/scalars")


if __name__ == "__main__":
    main()
