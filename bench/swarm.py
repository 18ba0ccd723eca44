#!/usr/bin/env python3
"""Four "machines" on slow links: ddp, cohort's swarm, DiLoCo (none, int8) and Hivemind itself, in one run.

Each peer runs in its own network namespace, joined to the others through a bridge in a hub namespace;
every link is shaped with tc's tbf qdisc in both directions (netem is missing on these machines), as
bench/slow_network.py does. The job is cohort's default one (resnet8 w32 on Fashion-MNIST, SGD Nesterov,
one-cycle, label smoothing, flips), at a local batch of 64 and a global batch (target_batch_size) of 256.
For each system and link rate it records:
  - test accuracy at equal samples (the run's end: every system trains on the same number of samples),
  - wall time to 90% test accuracy (peer 0 evaluates every --eval-every global steps),
  - bytes sent per training sample, from the interfaces' counters (every peer's veth, all traffic),
  - with --kill: one peer killed with SIGKILL mid-run: the others' longest step after it, and whether
    they finished; with --join too, a newcomer with no files starts in the killed peer's namespace that
    many seconds later (through peer 0), catches up from the others and trains to the end with them.
Hivemind (bench/peers/hivemind_fmnist.py, hivemind.Optimizer with the same model, data and recipe in
PyTorch) runs at its own defaults (matchmaking 15 s, averaging timeout 60 s), at Lightning's
HivemindStrategy defaults (5 s, 30 s) and over the grid cohort's swarm is run on (--grid), so neither side
gets a tuning the other did not. Without --hivemind-python the Hivemind rows say why they are missing.
Needs root (ip netns, tc). Prints JSON; --out writes it.

Run: sudo python3 bench/swarm.py --cohort build/cohort --rates 100mbit,10mbit \\
       --hivemind-python ~/.cache/cohort/hivemind/bin/python --out bench/results/swarm.json
A quicker subset: --systems ddp,swarm,diloco-int8 --rates 100mbit --epochs 1"""
import argparse, json, os, secrets, shutil, signal, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import emit  # noqa: E402

PEERS = 4
HUB = "csw-hub"
NS = [f"csw-{i}" for i in range(PEERS)]
ADDR = [f"10.79.0.{i + 1}" for i in range(PEERS)]
LOCAL_BATCH, GLOBAL_BATCH = 64, 256
TRAIN_SIZE = 60000


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def teardown():
    for ns in NS + [HUB]:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    """A bridge in the hub namespace; each peer's veth shaped to `rate` each way."""
    teardown()
    sh("ip", "netns", "add", HUB)
    sh("ip", "-n", HUB, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", HUB, "link", "set", "br0", "up")
    for i, ns in enumerate(NS):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", f"csw-v{i}", "netns", ns, "type", "veth", "peer", "name", f"csw-h{i}", "netns", HUB)
        sh("ip", "-n", ns, "addr", "add", ADDR[i] + "/24", "dev", f"csw-v{i}")
        sh("ip", "-n", ns, "link", "set", f"csw-v{i}", "up")
        sh("ip", "-n", HUB, "link", "set", f"csw-h{i}", "master", "br0")
        sh("ip", "-n", HUB, "link", "set", f"csw-h{i}", "up")
        for where, dev in ((ns, f"csw-v{i}"), (HUB, f"csw-h{i}")):
            sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
               "burst", "64kb", "latency", "400ms")


def tx_bytes():
    """Bytes each peer's interface has sent so far."""
    out = []
    for i, ns in enumerate(NS):
        link = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", f"csw-v{i}").stdout)[0]
        out.append(link["stats64"]["tx"]["bytes"])
    return out


def cohort_args(a, system, settings, run_dir, i, port, min_group=PEERS, every_step=False):
    """`cohort train` for peer i of `system` (ddp, swarm, diloco-none, diloco-int8). every_step: a metrics
    record every step, for a run with a kill: a record carries its step's round time only, so the longest
    round after a kill is the largest of them all (Hivemind's peer records every opt.step() too)."""
    args = [a.cohort, "train", "--run-dir", run_dir, "--nproc-per-node", "1", f"data.batch_size={LOCAL_BATCH}",
            f"train.epochs={a.epochs}", "train.threads=1", f"amp.precision={a.precision}",
            "train.channels_last=false", "ckpt.save_best=false", "log.progress=plain",
            f"log.every_steps={1 if every_step else 10}", "dist.timeout_s=600", f"optim.lr={a.lr}"]
    # ddp's ranks evaluate together, a quarter of the test set each. A swarm or DiLoCo peer evaluates the
    # whole of it: with --eval-on all every peer does, at the same steps, so that none falls behind the
    # others; with --eval-on peer0 only peer 0 does (the evaluation work ddp does), and its matchmaking
    # window must cover its evaluation. Peer 0's figures are the ones reported.
    if system != "ddp" and a.eval_on == "peer0" and i > 0:
        args.append("eval.enabled=false")
    else:
        args.append(f"eval.every_steps={a.eval_every}")
    if a.max_steps:
        args.append(f"train.max_steps={a.max_steps}")
    if system == "ddp":
        return args + ["--nnodes", str(PEERS), "--node-rank", str(i), "--master-addr", ADDR[0],
                       "--master-port", str(port)]
    args += [f"swarm.listen={ADDR[i]}:{port}", "swarm.insecure=true", f"swarm.min_peers_to_start={PEERS}",
             f"swarm.matchmaking_s={settings['matchmaking']}", f"swarm.averaging_timeout_s={settings['timeout']}"]
    if i > 0:
        args.append(f"swarm.initial_peers={ADDR[0]}:{port}")
    if system == "swarm":
        return args + ["dist.strategy=swarm", f"swarm.target_batch_size={GLOBAL_BATCH}",
                       f"swarm.compress={a.compress}"]
    # DiLoCo: each peer trains on its DistributedSampler shard, one local batch a step, so the four
    # together see each sample once an epoch and take as many steps as ddp.
    assert system.startswith("diloco-")
    args = [x for x in args if not x.startswith("optim.lr")]
    return args + ["dist.strategy=diloco", f"diloco.compress={system.split('-')[1]}",
                   f"diloco.inner_steps={a.inner_steps}", "swarm.sampler=partition", f"swarm.partitions={PEERS}",
                   f"swarm.partition={i}", f"swarm.min_group_size={min_group}", f"optim.lr={diloco_inner_lr(a)}",
                   f"diloco.outer_lr={a.outer_lr}", f"diloco.outer_momentum={a.outer_momentum}"]


def diloco_inner_lr(a):
    """DiLoCo's inner learning rate: --inner-lr, or the synchronous recipe's own, as the DiLoCo paper's inner
    optimizer takes the baseline's. (Scaled to the local batch, lr x 64/256, it ended 2.06 points below
    ddp at H = 50; at the recipe's lr, 1.37 points below: bench/results/swarm_full.json's diloco_tuning.)"""
    return a.inner_lr if a.inner_lr else a.lr


def hivemind_args(a, settings, run_dir, i, port):
    peer = os.path.join(HERE, "peers", "hivemind_fmnist.py")
    maddr = os.path.join(run_dir, "..", "maddr.txt")
    args = [a.hivemind_python, peer, "--host", ADDR[i], "--port", str(port), "--peer-index", str(i),
            "--npeers", str(PEERS), "--batch", str(LOCAL_BATCH), "--target-batch-size", str(GLOBAL_BATCH),
            "--matchmaking-time", str(settings["matchmaking"]), "--averaging-timeout", str(settings["timeout"]),
            "--max-samples", str(a.max_steps * GLOBAL_BATCH if a.max_steps else a.epochs * TRAIN_SIZE), "--events", os.path.join(run_dir, "events.jsonl"),
            "--run-id", "cohort-bench", "--eval-every-steps", str(0 if a.eval_on == "peer0" and i > 0 else a.eval_every),
            "--stall-s", "0", "--compression", a.compress]  # every step's time: the longest one after a kill is what --kill reports
    return args + (["--maddr-out", maddr] if i == 0 else ["--initial-peers", maddr])


class Watch:
    """Stamps each of peer 0's evaluation records with the bench's own clock as it appears."""

    def __init__(self, system, run_dir, start):
        self.system, self.run_dir, self.start, self.seen, self.points = system, run_dir, start, 0, []
        self.train_points = []  # cohort's: (its training clock, evaluation excluded; accuracy)

    def poll(self):
        name = "events.jsonl" if self.system == "hivemind" else "metrics.jsonl"
        path = os.path.join(self.run_dir, name)
        if not os.path.exists(path):
            return
        lines = open(path).read().splitlines()
        for line in lines[self.seen:]:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                return  # a line being written: read it next time
            self.seen += 1
            acc = r.get("test_acc") if self.system == "hivemind" else (
                r.get("test_top1") if r.get("kind") == "eval" else None)
            if acc is not None:
                self.points.append((round(time.time() - self.start, 1), acc))
                if "train_seconds" in r:
                    self.train_points.append((round(r["train_seconds"], 1), acc))


def run(a, system, rate, settings, port, kill_at=None):
    """One run of `system`: 4 peers started together; returns its figures."""
    base = tempfile.mkdtemp(prefix=f"cohort-swarm-{system}-")
    dirs = [os.path.join(base, f"peer{i}") for i in range(PEERS)]
    for d in dirs:
        os.makedirs(d)
    env = dict(os.environ, COHORT_TOKEN=secrets.token_hex(32), OMP_NUM_THREADS="1")
    # DiLoCo's outer rounds wait for every peer; with one killed, for the three left.
    min_group = PEERS - 1 if kill_at is not None else PEERS
    before = tx_bytes()
    start = time.time()
    procs = []
    for i in range(PEERS):
        argv = hivemind_args(a, settings, dirs[i], i, port) if system == "hivemind" else cohort_args(
            a, system, settings, dirs[i], i, port, min_group, every_step=kill_at is not None)
        log = open(os.path.join(dirs[i], "out.log"), "w")
        procs.append(subprocess.Popen(["ip", "netns", "exec", NS[i]] + argv, stdout=log, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True))
        if system == "hivemind" and i == 0:  # the others bootstrap from the first one's address
            while not os.path.exists(os.path.join(base, "maddr.txt")) and procs[0].poll() is None:
                time.sleep(0.2)
    watch = Watch(system, dirs[0], start)
    killed = joined = None
    reached = False
    deadline = start + a.run_timeout
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        watch.poll()
        if kill_at is not None and killed is None and time.time() - start >= kill_at:
            killed = (PEERS - 1, round(time.time() - start, 1))
            os.killpg(procs[-1].pid, signal.SIGKILL)
            procs[-1].wait()
            killed_proc = procs[-1]
        if killed and a.join and joined is None and time.time() - start >= kill_at + a.join:
            # The newcomer takes the killed peer's place (its namespace, address and DiLoCo shard) with an
            # empty run directory: everything it has comes from the live peers.
            joined = round(time.time() - start, 1)
            dirs.append(os.path.join(base, f"peer{PEERS - 1}-newcomer"))
            os.makedirs(dirs[-1])
            argv = hivemind_args(a, settings, dirs[-1], PEERS - 1, port) if system == "hivemind" else cohort_args(
                a, system, settings, dirs[-1], PEERS - 1, port, min_group, every_step=True)
            log = open(os.path.join(dirs[-1], "out.log"), "w")
            procs[-1] = subprocess.Popen(["ip", "netns", "exec", NS[-1]] + argv, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if a.stop_at_target and any(acc >= a.target for _, acc in watch.points):
            # To the SIGTERM, grace and SIGKILL below: a peer that hangs in its shutdown (a Hivemind peer
            # did, 5 minutes after writing its report) must not hold the run until --run-timeout.
            reached = True
            break
        time.sleep(0.2)
    timed_out = not reached and any(p.poll() is None for p in procs)
    # SIGTERM first, so that a run cut by --run-timeout still writes its report (Hivemind's peers their
    # final samples, cohort's its summary.json); whatever is left after 40 s is killed.
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    grace = time.time() + 40
    while any(p.poll() is None for p in procs) and time.time() < grace:
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    watch.poll()
    wall = round(time.time() - start, 1)
    sent = sum(after - b for after, b in zip(tx_bytes(), before))
    out = {"system": system, "rate": rate, "settings": settings, "stop_at_target": a.stop_at_target,
           "eval_on": "every rank, a quarter each" if system == "ddp" else a.eval_on, "wall_s": wall, "timed_out": timed_out,
           "exit_codes": [p.returncode for p in procs], "evals": watch.points}
    if system in ("swarm", "hivemind"):
        out["compress"] = a.compress
    if system.startswith("diloco-"):
        out["diloco"] = {"inner_steps": a.inner_steps, "inner_lr": diloco_inner_lr(a), "outer_lr": a.outer_lr,
                         "outer_momentum": a.outer_momentum}
    hit = [t for t, acc in watch.points if acc >= a.target]
    out["seconds_to_target"] = hit[0] if hit else None
    # Evaluation is the benchmark's own cost and, with --eval-on all, not the same for every system: ddp's
    # ranks each evaluate a quarter of the test set, every swarm and DiLoCo peer the whole of it. So cohort's
    # runs also report their time to the target on the trainer's own clock, which stops during evaluation.
    if watch.train_points:
        out["train_evals"] = watch.train_points
        hit = [t for t, acc in watch.train_points if acc >= a.target]
        out["train_seconds_to_target"] = hit[0] if hit else None
    out["final_test_accuracy"] = watch.points[-1][1] if watch.points else None
    samples = samples_trained(system, dirs)
    out["samples"] = samples
    if system != "hivemind":
        out["nominal_samples"] = nominal_samples(dirs)
    out["bytes_sent"] = sent
    out["bytes_per_sample"] = round(sent / samples, 1) if samples else None
    if killed:
        out["killed"] = {"peer": killed[0], "at_s": killed[1], "exit_code": killed_proc.returncode}
        out["survivors_finished"] = all(p.returncode == 0 for p in procs[:-1])
        survivors = dirs[:PEERS - 1]
        out["longest_stall_s"] = longest_stall(system, survivors, start, kill_at)
    if joined:
        newcomer_log = open(os.path.join(dirs[-1], "out.log")).read()
        out["joined"] = {"at_s": joined, "exit_code": procs[-1].returncode,
                         "caught_up": "caught up to step" in newcomer_log if system != "hivemind" else None}
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        out["dir"] = base
    return out


def samples_trained(system, dirs):
    """Samples all peers trained on together. ddp and DiLoCo: steps of GLOBAL_BATCH samples (ddp's global
    batch, four DiLoCo shards of LOCAL_BATCH), from peer 0's last metrics record, so that a run stopped at
    the target counts too. cohort's swarm: what each peer says it trained (swarm_samples), as a peer may
    take more than its share of a step. Hivemind: the peers' own counts."""
    if system == "hivemind":
        # A peer's final report, or, where it was killed before writing one (a peer blocked in a round
        # outlives the 40 s after SIGTERM), its per-step events: with --stall-s 0 each opt.step() writes
        # one, a local batch each.
        total = 0
        for d in dirs:
            path = os.path.join(d, "events.jsonl")
            events = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
            done = [e for e in events if e.get("done")]
            total += done[-1].get("local_samples", 0) if done else LOCAL_BATCH * sum("stall_s" in e for e in events)
        return total
    if system == "swarm":
        total = 0
        for d in dirs:
            path = os.path.join(d, "metrics.jsonl")
            records = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
            total += max([r.get("swarm_samples", 0) for r in records] or [0])
        return int(total)
    return nominal_samples(dirs)


def nominal_samples(dirs):
    """Global steps x GLOBAL_BATCH, from peer 0's last metrics record."""
    path = os.path.join(dirs[0], "metrics.jsonl")
    steps = [json.loads(line).get("step", 0) for line in open(path)] if os.path.exists(path) else [0]
    return max(steps) * GLOBAL_BATCH


def longest_stall(system, dirs, start, kill_at):
    """The survivors' longest optimizer step after the kill: cohort's longest round (metrics.jsonl), or
    Hivemind's longest opt.step() (its peer logs every step slower than --stall-s)."""
    worst = 0.0
    for d in dirs:
        name = "events.jsonl" if system == "hivemind" else "metrics.jsonl"
        path = os.path.join(d, name)
        for line in open(path) if os.path.exists(path) else []:
            r = json.loads(line)
            if system == "hivemind":
                if r.get("t", 0) >= kill_at - 1:
                    worst = max(worst, r.get("stall_s", 0.0))
            elif r.get("time", 0) >= start + kill_at - 1:
                worst = max(worst, r.get("swarm_round_seconds", 0.0))
    return worst


def settings_of(text):
    """'M:T' -> the matchmaking and averaging timeout settings, in seconds."""
    m, t = text.split(":")
    return {"matchmaking": float(m), "timeout": float(t)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--rates", default="100mbit,10mbit")
    ap.add_argument("--systems", default="ddp,swarm,diloco-none,diloco-int8,hivemind")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=0, help="a smoke run: stop after this many global steps")
    ap.add_argument("--lr", type=float, default=0.2, help="cohort's optim.lr: the recipe Hivemind's peer uses at batch 256 (cohort's default "
                    "is 1.2 since 2026-12-01, 0.8 before: docs/default-job.md)")
    ap.add_argument("--precision", default="fp32", help="fp32 on both sides: Hivemind's peer trains in fp32")
    ap.add_argument("--inner-steps", type=int, default=50, help="DiLoCo's H")
    ap.add_argument("--inner-lr", type=float, default=0, help="DiLoCo's inner optim.lr (0: --lr)")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="diloco.outer_lr (cohort's default: the paper's)")
    ap.add_argument("--outer-momentum", type=float, default=0.9, help="diloco.outer_momentum")
    ap.add_argument("--eval-every", type=int, default=40, help="global steps between peer 0's evaluations")
    ap.add_argument("--eval-on", choices=["all", "peer0"], default="all",
                    help="which swarm, DiLoCo and Hivemind peers evaluate (ddp's ranks always share it)")
    ap.add_argument("--target", type=float, default=0.90)
    ap.add_argument("--stop-at-target", action="store_true", help="end a run once the target accuracy is reached")
    # DiLoCo's peers reach an outer step after 50 inner steps on shared cores, seconds apart: with the
    # swarm's 2 s (it steps every second) the leader often gave up on the last one, which then stepped
    # alone and downloaded the others' state (4 failed rounds of 15 in one run). A longer window costs
    # nothing when all are there: the leader sends the group as soon as every live peer is ready.
    ap.add_argument("--diloco-settings", default="10:30", help="DiLoCo's matchmaking:timeout")
    ap.add_argument("--grid", default="2:10,5:30", help="matchmaking:timeout settings both swarms run")
    ap.add_argument("--kill", type=float, default=0, help="also a run of each swarm with a peer killed at this second")
    ap.add_argument("--kill-only", action="store_true", help="with --kill: the swarms' killed runs alone")
    ap.add_argument("--join", type=float, default=0,
                    help="with --kill: a newcomer with no files starts this many seconds after the kill")
    ap.add_argument("--hivemind-python", default="", help="a Python with hivemind 1.1.12 and torch")
    ap.add_argument("--no-hivemind-defaults", action="store_true",
                    help="run Hivemind on --grid only, not also at its own and Lightning's defaults")
    ap.add_argument("--compress", choices=["none", "fp16", "int8"], default="none",
                    help="how both swarms' gradients travel: cohort's swarm.compress; Hivemind's grad_compression "
                         "(Float16Compression, or Uniform8BitQuantization for int8) with its state averaging in "
                         "fp16; ddp and DiLoCo are unchanged")
    ap.add_argument("--run-timeout", type=float, default=3600)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--merge", action="store_true", help="add to the runs already in --out")
    ap.add_argument("--out")
    a = ap.parse_args()
    a.cohort = os.path.abspath(a.cohort)
    if os.geteuid() != 0:
        sys.exit("bench/swarm.py needs root for ip netns and tc")
    grid = [settings_of(x) for x in a.grid.split(",")]
    hivemind_settings = grid
    if not a.no_hivemind_defaults:
        hivemind_settings = [{"matchmaking": 15.0, "timeout": 60.0, "name": "hivemind.Optimizer defaults"},
                             {"matchmaking": 5.0, "timeout": 30.0, "name": "Lightning HivemindStrategy defaults"}] + grid
    res = {"bench": "swarm", "peers": PEERS, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "job": f"resnet8 w32, Fashion-MNIST, local batch {LOCAL_BATCH}, global batch {GLOBAL_BATCH}, "
                  f"{a.epochs} epochs of samples, {a.precision}, 1 thread per peer",
           "link": "4 network namespaces on a bridge, tc tbf at the rate each way on every link",
           "target_accuracy": a.target, "runs": []}
    port = 7100
    try:
        for rate in a.rates.split(","):
            setup(rate)
            for system in a.systems.split(","):
                if system == "hivemind" and not a.hivemind_python:
                    res["runs"].append({"system": "hivemind", "rate": rate, "skipped": "no --hivemind-python given"})
                    continue
                if system == "hivemind":
                    settings = hivemind_settings
                elif system == "swarm":
                    settings = grid
                elif system.startswith("diloco-"):
                    settings = [settings_of(a.diloco_settings)]
                else:
                    settings = [grid[-1]]  # ddp: recorded, not used
                for s in settings:
                    if not (a.kill_only and a.kill and system != "ddp"):
                        port += 1
                        r = run(a, system, rate, s, port)
                        print(json.dumps(r), file=sys.stderr)
                        res["runs"].append(r)
                    if a.kill and system in ("swarm", "hivemind", "diloco-none", "diloco-int8"):
                        port += 1
                        r = run(a, system, rate, s, port, kill_at=a.kill)
                        print(json.dumps(r), file=sys.stderr)
                        res["runs"].append(r)
    finally:
        teardown()
    if a.merge and a.out and os.path.exists(a.out):
        # Runs of this invocation replace the same runs of an earlier one; the others stay.
        def key(r):
            return (r["system"], r["rate"], json.dumps(r.get("settings")), "killed" in r, "joined" in r,
                    r.get("stop_at_target"))
        mine = {key(r) for r in res["runs"]}
        res["runs"] = [r for r in json.load(open(a.out))["runs"] if key(r) not in mine] + res["runs"]
    emit(res, a.out)


if __name__ == "__main__":
    main()
