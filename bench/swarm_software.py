#!/usr/bin/env python3
"""What averaging costs a swarm peer in its own software: cohort's swarm against Hivemind, on loopback,
where no link limits either, so a round's time is the peers' code (framing, MACs, copies, the sum).

Each peer is one process with one thread. cohort's peers train torchvision's ResNet-18 or ResNet-50
(a 1-channel stem, 10 classes: 11,175,370 and 23,522,250 parameters) on Fashion-MNIST at 32 px and average
their fp32 gradients every step (`dist.strategy=swarm`, `swarm.compress=none`, one group of all); a
round's time is its `swarm_averaging_seconds`, matchmaking left out. Hivemind's peers
(bench/peers/hivemind_average.py) average a vector of as many fp32 values with its DecentralizedAverager,
NoCompression, timed around its all-reduce alone. Both move the same bytes: a member sends 2 (g-1)/g of the
vector a round (checked for cohort from its summary). The first two rounds are left out (peers still
starting); each figure is the median over every peer's rounds. The cost is reported as seconds a round,
the averaging rate a member reaches (bytes it sent a round / seconds) and nanoseconds per byte sent, for
2 peers at both sizes (how it grows with the vector) and 4 peers at ResNet-18's (how it grows with the
group, on 2 cores: the peers share them). With --old, a second cohort build runs the same rounds,
interleaved, for a change to the averaging path.

Run: python3 bench/swarm_software.py --cohort build/cohort \\
       --hivemind-python ~/.cache/cohort/torch-2.14.1/bin/python --out bench/results/swarm_software.json
Prints JSON; --out also writes it."""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import emit, machine, swarm_peer_args  # noqa: E402

PARAMS = {"resnet18": 11_175_370, "resnet50": 23_522_250}
CONFIGS = [("resnet18", 2), ("resnet50", 2), ("resnet18", 4)]
WARMUP = 2


def addr(i):
    return f"127.0.0.{20 + i}"


def wait_all(procs, outs, what, timeout_s):
    try:
        for p in procs:
            p.wait(timeout=timeout_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode != 0 for p in procs):
        tails = [open(o, errors="replace").read()[-1500:] for o in outs]
        sys.exit(f"{what} failed:\n" + "\n".join(tails))


def run_cohort(binary, model, peers, rounds, port):
    """Seconds of every peer's rounds after the warm-up, and the averaging bytes a peer sent a round."""
    work = tempfile.mkdtemp(prefix="cohort-swsw-")
    procs, outs = [], []
    for i in range(peers):
        args = swarm_peer_args(binary, os.path.join(work, f"p{i}"), f"{addr(i)}:{port}", peers, i, peers,
                               group_size=0, steps=rounds + WARMUP, matchmaking_s=2, averaging_timeout_s=120,
                               dist_timeout_s=600, bootstrap=f"{addr(0)}:{port}" if i else None,
                               extra=[f"model.name={model}", "data.image_size=32", "data.batch_size=16",
                                      "data.augment=false", "train.channels_last=false", "swarm.compress=none",
                                      "ckpt.save_best=false"])
        outs.append(os.path.join(work, f"out{i}.txt"))
        # Into a file each: a pipe read only after the others' would stall a peer that writes more than it holds.
        procs.append(subprocess.Popen(args, stdout=open(outs[-1], "w"), stderr=subprocess.STDOUT,
                                      env=dict(os.environ, OMP_NUM_THREADS="1")))
    wait_all(procs, outs, f"cohort's swarm of {peers} ({model})", 1800)
    seconds, sent = [], []
    for i in range(peers):
        d = os.path.join(work, f"p{i}")
        s = json.load(open(os.path.join(d, "summary.json")))
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for r in map(json.loads, f):
                if r.get("swarm_group_size") == peers and r.get("step", 0) > WARMUP:
                    seconds.append(r["swarm_averaging_seconds"])
        if s["swarm_rounds"]:
            sent.append((s["swarm_bytes_sent"] - s.get("swarm_record_bytes_sent", 0)) / s["swarm_rounds"])
    shutil.rmtree(work, ignore_errors=True)
    return seconds, statistics.mean(sent) if sent else None


def run_hivemind(python, numel, peers, rounds, port):
    work = tempfile.mkdtemp(prefix="cohort-swsw-hm-")
    maddrs = os.path.join(work, "maddrs")
    procs, outs, timings = [], [], []
    for i in range(peers):
        timings.append(os.path.join(work, f"t{i}.jsonl"))
        outs.append(os.path.join(work, f"out{i}.txt"))
        args = [python, os.path.join(HERE, "peers", "hivemind_average.py"), "--host", addr(i), "--port", str(port),
                "--npeers", str(peers), "--numel", str(numel), "--rounds", str(rounds + WARMUP), "--out", timings[-1]]
        args += ["--maddr-out", maddrs] if i == 0 else ["--initial-peers", maddrs]
        procs.append(subprocess.Popen(args, stdout=open(outs[-1], "w"), stderr=subprocess.STDOUT,
                                      env=dict(os.environ, OMP_NUM_THREADS="1")))
    wait_all(procs, outs, f"Hivemind's {peers} peers", 900)
    seconds = []
    for t in timings:
        rows = [json.loads(line) for line in open(t)] if os.path.exists(t) else []
        seconds += [r["seconds"] for r in rows[WARMUP:] if r["group_size"] == peers]
    shutil.rmtree(work, ignore_errors=True)
    return seconds


def summarise(seconds, numel, peers):
    """The median round, and what it means per byte a member sent."""
    if not seconds:
        return {"rounds": 0}
    sent = 2 * (peers - 1) / peers * 4 * numel
    median = statistics.median(seconds)
    return {"rounds": len(seconds), "round_s_median": round(median, 4),
            "round_s_min": round(min(seconds), 4), "round_s_max": round(max(seconds), 4),
            "bytes_sent_per_member": int(sent), "mb_per_s": round(sent / median / 1e6, 1),
            "ns_per_byte_sent": round(median / sent * 1e9, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", required=True)
    ap.add_argument("--old", help="a second cohort build, run interleaved with --cohort")
    ap.add_argument("--hivemind-python", help="a Python with hivemind (scripts/pip-libtorch's environment)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each system per configuration, interleaved")
    ap.add_argument("--configs", default=",".join(f"{m}:{p}" for m, p in CONFIGS), help="MODEL:PEERS,...")
    ap.add_argument("--out")
    a = ap.parse_args()
    systems = {"cohort": a.cohort}
    if a.old:
        systems["cohort_old"] = a.old
    rows, port, began = [], 29700, time.time()
    for config in a.configs.split(","):
        model, peers = config.split(":")
        peers, numel = int(peers), PARAMS[model]
        seconds = {name: [] for name in list(systems) + (["hivemind"] if a.hivemind_python else [])}
        sent = []
        for _ in range(a.repeats):
            for name, binary in systems.items():
                port += 1
                s, b = run_cohort(binary, model, peers, a.rounds, port)
                seconds[name] += s
                if name == "cohort" and b:
                    sent.append(b)
            if a.hivemind_python:
                port += 1
                seconds["hivemind"] += run_hivemind(a.hivemind_python, numel, peers, a.rounds, port)
        row = {"model": model, "parameters": numel, "peers": peers}
        row.update({name: summarise(s, numel, peers) for name, s in seconds.items()})
        expected = 2 * (peers - 1) / peers * 4 * numel
        row["cohort"]["measured_bytes_sent_per_round"] = int(statistics.mean(sent)) if sent else None
        row["cohort"]["bytes_over_expected"] = round(statistics.mean(sent) / expected, 4) if sent else None
        mine = row["cohort"].get("round_s_median")
        for other in ("hivemind", "cohort_old"):
            theirs = row.get(other, {}).get("round_s_median")
            if mine and theirs:
                row[f"{other}_over_cohort"] = round(theirs / mine, 3)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    emit({"benchmark": "swarm_software", "machine": machine(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "command": " ".join(["python3"] + sys.argv), "rounds_per_run": a.rounds,
          "repeats": a.repeats, "wall_s": round(time.time() - began, 1), "rows": rows}, a.out)


if __name__ == "__main__":
    main()
