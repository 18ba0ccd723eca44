#!/usr/bin/env python3
"""Step time over a slow link: two "machines" as network namespaces joined by a veth pair shaped with
tc's tbf qdisc (netem is missing on these machines), one cohort worker in each, launched with
--nnodes 2 as on two real machines. In one run: dist.compress none, fp16 and powersgd, and
uncompressed DDP with and without overlap; then PyTorch's own DDP hooks on the same link and model
(bench/peer_torch_compress.py; --no-peer skips them). Needs root (ip netns, tc). Prints JSON; --out writes it.

The model is ResNet-18 on Fashion-MNIST (11.7 M parameters, 47 MB of gradients a step): across an
ordinary network its all-reduce costs more than its compute, the case gradient compression is for.
Run: sudo python3 bench/slow_network.py --cohort build/cohort --rate 100mbit --out bench/results/slow_network.json"""
import argparse, json, os, secrets, shutil, subprocess, sys, tempfile, time

NS = ("cohort-bench-a", "cohort-bench-b")
VETH = ("cbv-a", "cbv-b")
ADDR = ("10.77.0.1", "10.77.0.2")


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def teardown():
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    teardown()
    for ns in NS:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", VETH[0], "netns", NS[0], "type", "veth", "peer", "name", VETH[1], "netns", NS[1])
    for ns, dev, addr in zip(NS, VETH, ADDR):
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        # Egress shaping on both ends: each direction of the link runs at `rate`.
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "256kb", "latency", "200ms")


def train_on_two_nodes(cohort, port, args, what):
    """`cohort train` with --nnodes 2, one worker in each namespace; returns rank 0's summary.json."""
    run_dir = tempfile.mkdtemp(prefix="cohort-slow-")
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", ADDR[0], "--master-port", str(port),
              "--run-dir", run_dir] + args
    # Two "machines" share the rendezvous store over a routable address, so cohort asks for a shared secret.
    env = dict(os.environ, COHORT_TOKEN=secrets.token_hex(32))
    procs = [subprocess.Popen(["ip", "netns", "exec", NS[i], cohort, "train", "--node-rank", str(i)] + common,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for i in range(2)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"{what} failed:\n" + "\n".join(o[-3000:] for o in outs))
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    shutil.rmtree(run_dir, ignore_errors=True)
    return s


def run(a, name, extra, port):
    args = ["model.name=resnet18", f"data.batch_size={a.batch}", f"train.max_steps={a.steps}",
            "eval.enabled=false", "ckpt.save_best=false", "log.every_steps=1000", "train.threads=1",
            "dist.timeout_s=120", "amp.precision=fp32", "train.channels_last=false"] + extra  # comparable with earlier runs
    s = train_on_two_nodes(a.cohort, port, args, name)
    return {"step_seconds": round(s["train_seconds"] / s["steps"], 3),
            "sync_bytes_per_step": s["sync_bytes_per_step"],
            "sync_bytes_per_step_uncompressed": s["sync_bytes_per_step_uncompressed"]}


def run_peer(a, compress, port):
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_torch_compress.py")
    procs = []
    for i in range(2):
        env = dict(os.environ, RANK=str(i), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR=ADDR[0],
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=VETH[i], OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(["ip", "netns", "exec", NS[i], a.python, peer, "--compress", compress,
                                       "--steps", str(a.steps), "--batch", str(a.batch)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"peer {compress} failed:\n" + "\n".join(o[-3000:] for o in outs))
    return json.loads([l for l in outs[0].splitlines() if l.startswith("{")][-1])["step_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (its torch)")
    ap.add_argument("--no-peer", action="store_true", help="skip PyTorch's DDP hooks (bench/peer_torch_compress.py)")
    a = ap.parse_args()
    a.cohort = os.path.abspath(a.cohort)
    if os.geteuid() != 0:
        sys.exit("bench/slow_network.py needs root for ip netns and tc")
    configs = [
        ("none", []),
        ("none, no overlap", ["dist.overlap=false"]),
        ("fp16", ["dist.compress=fp16"]),
        ("powersgd rank 2", ["dist.compress=powersgd", "powersgd.rank=2", "powersgd.start_iter=0"]),
    ]
    res = {"bench": "slow_network", "link": f"veth between two network namespaces, tc tbf {a.rate} each way",
           "model": "resnet18 on fashion-mnist", "batch_per_worker": a.batch, "steps": a.steps,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": {}}
    try:
        setup(a.rate)
        for i, (name, extra) in enumerate(configs):
            res["runs"][name] = run(a, name, extra, 29710 + i)
            print(name, res["runs"][name], file=sys.stderr)
        if not a.no_peer:
            res["pytorch"] = {}
            for i, c in enumerate(("none", "fp16", "powersgd")):
                res["pytorch"][c] = {"step_seconds": run_peer(a, c, 29730 + i)}
                print("pytorch", c, res["pytorch"][c], file=sys.stderr)
    finally:
        teardown()
    base = res["runs"]["none"]["step_seconds"]
    res["speedup_over_none"] = {k: round(base / v["step_seconds"], 2) for k, v in res["runs"].items()}
    if "pytorch" in res:
        pbase = res["pytorch"]["none"]["step_seconds"]
        res["pytorch_speedup_over_none"] = {k: round(pbase / v["step_seconds"], 2) for k, v in res["pytorch"].items()}
        pairs = (("none", "none"), ("fp16", "fp16"), ("powersgd rank 2", "powersgd"))
        res["cohort_step_time_over_pytorch"] = {
            c: round(res["runs"][c]["step_seconds"] / res["pytorch"][p]["step_seconds"], 2) for c, p in pairs}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
