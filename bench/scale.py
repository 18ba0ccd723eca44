#!/usr/bin/env python3
"""How the swarm's costs grow with the number of peers: 4 to 64 peers on this machine, each a `cohort
train` process on its own loopback address (127.0.0.10 and up), the MLP with one thread each.

The settings are those of issue 41's first measurement: swarm.sampler=partition (one 32-sample batch per
peer per step), swarm.insecure, swarm.matchmaking_s=2, swarm.averaging_timeout_s=10, 60 steps. For each
count and swarm.group_size it records, over all peers:
  - rounds completed, the mean group size, failed rounds per peer (swarm_failed_rounds);
  - the median and p95 round time (each step's swarm_round_seconds, log.every_steps=1);
  - averaging bytes sent per peer per round, and background (directory record) bytes per peer per second;
  - the largest resident memory of a peer (VmRSS sampled every 0.5 s), and the wall time.
Every peer runs on the same cores, so past a few peers per core the machine, not the swarm, sets the
round time: compare the counts with each other and group sizes at one count, not with a cluster.
Parts not built yet (Hivemind at the same counts, ddp/zero/fsdp against torchrun, the store with 1,024
clients, faults at scale) are listed under "not_run" with the reason.

Run: python3 bench/scale.py --cohort build/cohort --peers 4,8,16,32 --group-sizes 0,8 --out bench/results/scale.json"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import emit  # noqa: E402


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(x) for x in out]
    return kids + [d for k in kids for d in descendants(k)]


def run_swarm(cohort, peers, group_size, steps, port, work, extra=()):
    procs, dirs = [], []
    for i in range(peers):
        d = os.path.join(work, f"p{i}")
        dirs.append(d)
        args = [cohort, "train", "--run-dir", d, "--nproc-per-node", "1", "model.name=mlp", "data.train_limit=0",
                "data.test_limit=1000", "data.batch_size=32", "amp.precision=fp32", "dist.strategy=swarm",
                "swarm.insecure=true", f"swarm.listen=127.0.0.{10 + i}:{port}", "swarm.sampler=partition",
                f"swarm.partitions={peers}", f"swarm.partition={i}", f"swarm.min_peers_to_start={peers}",
                f"swarm.group_size={group_size}", "swarm.matchmaking_s=2", "swarm.averaging_timeout_s=10",
                f"train.max_steps={steps}", "train.epochs=1000", "train.threads=1", "eval.enabled=false",
                "log.every_steps=1", "log.progress=plain", "dist.timeout_s=300"] + list(extra)
        if i:
            args.append(f"swarm.initial_peers=127.0.0.10:{port}")
        procs.append(subprocess.Popen(args, stdout=open(os.path.join(work, f"out{i}.txt"), "w"),
                                      stderr=subprocess.STDOUT))
    start, peak = time.time(), 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            for pid in [p.pid] + descendants(p.pid):
                peak = max(peak, rss_kib(pid))
        time.sleep(0.5)
    wall = time.time() - start
    codes = [p.returncode for p in procs]
    rounds, failed, sizes, times, avg_bytes, record_rate = 0, [], [], [], [], []
    for d in dirs:
        try:
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
        except OSError:
            continue
        rounds += int(s["swarm_rounds"])
        failed.append(s["swarm_failed_rounds"])
        if s["swarm_rounds"]:
            avg_bytes.append((s["swarm_bytes_sent"] - s.get("swarm_record_bytes_sent", 0)) / s["swarm_rounds"])
        record_rate.append(s.get("swarm_record_bytes_sent", 0) / wall)
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if "swarm_group_size" in r:
                    sizes.append(r["swarm_group_size"])
                    times.append(r["swarm_round_seconds"])
    times.sort()
    # Why peers failed: each failed peer's error line, the same ones counted once.
    errors = {}
    for i, c in enumerate(codes):
        if c != 0:
            with open(os.path.join(work, f"out{i}.txt"), errors="replace") as f:
                lines = [l.strip() for l in f if "error" in l.lower()]
            why = lines[0] if lines else f"exit code {c}"
            errors[why] = errors.get(why, 0) + 1
    return {
        "peers": peers,
        "group_size": group_size,
        "peers_finished": sum(c == 0 for c in codes),
        "wall_s": round(wall, 1),
        "rounds": rounds,
        "mean_group_size": round(statistics.mean(sizes), 2) if sizes else None,
        "failed_rounds_per_peer": [min(failed), max(failed)] if failed else None,
        "round_s_median": round(statistics.median(times), 3) if times else None,
        "round_s_p95": round(times[int(0.95 * (len(times) - 1))], 3) if times else None,
        "averaging_bytes_per_peer_per_round": round(statistics.mean(avg_bytes)) if avg_bytes else None,
        "record_bytes_per_peer_per_s": round(statistics.mean(record_rate)) if record_rate else None,
        "peak_rss_mib_per_peer": round(peak / 1024, 1),
        "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--peers", default="4,8,16,32")
    ap.add_argument("--group-sizes", default="0,8")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every peer (repeatable), e.g. --set swarm.announce_s=3")
    ap.add_argument("--out")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    rows = []
    port = 27000
    for peers in [int(x) for x in a.peers.split(",")]:
        for gs in [int(x) for x in a.group_sizes.split(",")]:
            work = tempfile.mkdtemp(prefix=f"scale-{peers}-{gs}-")
            row = run_swarm(a.cohort, peers, gs, a.steps, port, work, a.set)
            port += 1
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
            if row["peers_finished"] == peers:
                shutil.rmtree(work, ignore_errors=True)
            else:
                row["logs"] = work  # kept: some peers failed
    emit({
        "bench": "scale",
        "commit": commit,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()},
        "parts_run": ["swarm (cohort)"],
        "not_run": {
            "swarm (hivemind)": "not built into this script yet",
            "ddp, zero1, fsdp against torchrun": "not built into this script yet",
            "store with 256 and 1,024 clients": "not built into this script yet",
            "faults at scale": "not built into this script yet",
        },
        "settings": {"model": "mlp", "local_batch": 32, "steps": a.steps, "matchmaking_s": 2,
                     "averaging_timeout_s": 10, "sampler": "partition", "threads_per_peer": 1, "set": a.set},
        "swarm": rows,
    }, a.out)


if __name__ == "__main__":
    main()
