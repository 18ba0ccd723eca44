#!/usr/bin/env python3
"""What the flight recorder (comm/FlightRecorder.h, docs/doctor.md) costs the default job.

1. One record's cost: build/bench/flight_record_cost (issued + ended, on a ring of 2,000).
2. Records a step: the default job is asked for its flight record (SIGUSR2) once it is under way; the
   entries' time span and the job's steps a second give the collectives a step.
3. The whole job with the recorder on (dist.flight_records=2000, the default) and off (0), alternating,
   --rounds each: training seconds, medians and spreads.
Prints JSON; --out writes it.
Run: python3 bench/flight_overhead.py --cohort build/cohort --out bench/results/flight_overhead.json"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import emit  # noqa: E402


def job_args(a, run_dir, records):
    return [a.cohort, "train", "--nproc-per-node", "2", "--run-dir", run_dir, f"train.max_steps={a.steps}",
            "eval.enabled=false", "log.progress=off", "ckpt.save_best=false", f"dist.flight_records={records}"]


def steps_logged(run_dir):
    try:
        recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    except OSError:
        return []
    return [(r["step"], r["train_seconds"]) for r in recs if r.get("kind") == "train"]


def records_per_step(a):
    """Asks a running default job for rank 0's record; collectives a step from its time span."""
    d = tempfile.mkdtemp(prefix="cohort-flight-")
    p = subprocess.Popen(job_args(a, d, 2000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while len(steps_logged(d)) < 3 and p.poll() is None:
            time.sleep(0.5)
        workers = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        for w in workers:
            os.kill(int(w), signal.SIGUSR2)
        path = os.path.join(d, "flight", "rank0.json")
        deadline = time.time() + 10
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.2)
        rec = json.load(open(path))
        logged = steps_logged(d)
    finally:
        p.kill()
        p.wait()
    (s0, t0), (s1, t1) = logged[0], logged[-1]
    steps_per_s = (s1 - s0) / (t1 - t0)
    entries = rec["entries"]
    span = entries[-1]["issued_unix"] - entries[0]["issued_unix"]
    shutil.rmtree(d, ignore_errors=True)
    return {"entries": len(entries), "span_s": span, "steps_per_s": steps_per_s,
            "records_per_step": len(entries) / (span * steps_per_s)}


def train_seconds(a, records):
    d = tempfile.mkdtemp(prefix="cohort-flight-")
    subprocess.run(job_args(a, d, records), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = json.load(open(os.path.join(d, "summary.json")))
    shutil.rmtree(d, ignore_errors=True)
    return s["train_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--cost", default="build/bench/flight_record_cost")
    ap.add_argument("--steps", type=int, default=200, help="steps of each whole-job run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    cost = json.loads(subprocess.run([a.cost], check=True, capture_output=True, text=True).stdout)
    per_step = records_per_step(a)
    on, off = [], []
    for _ in range(a.rounds):  # alternating, so that the machine's drift falls on both
        on.append(train_seconds(a, 2000))
        off.append(train_seconds(a, 0))
    step_s = statistics.median(off) / a.steps
    res = {"bench": "flight_overhead", "job": f"the default job, {a.steps} steps, 2 workers, no evaluation",
           "ns_per_record": cost["ns_per_record"], "records": per_step,
           "record_cost_share_of_step": cost["ns_per_record"] * 1e-9 * per_step["records_per_step"] / step_s,
           "train_seconds_on": on, "train_seconds_off": off,
           "median_on": statistics.median(on), "median_off": statistics.median(off),
           "spread_on": max(on) - min(on), "spread_off": max(off) - min(off),
           "on_over_off": statistics.median(on) / statistics.median(off)}
    emit(res, a.out)


if __name__ == "__main__":
    main()
