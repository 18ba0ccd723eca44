"""What every JSON benchmark here shares: the machine it ran on, and the result printed, and written to --out
when given."""
import json
import os
import subprocess


def machine():
    """The CPU kind. Figures differ by kind: `auto` picks bf16 where oneDNN has AMX or AVX512-BF16 and its
    bf16 measures at least 1.25x its fp32 (train/AutoSettings.h), and the
    contiguous layout without AVX-512; the AVX2-only kind runs about 2.3 times slower."""
    model, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return {"cores": os.cpu_count(), "cpu": model,
            "vector_isa": [f for f in ("avx2", "avx512f") if f in flags],
            "bf16_isa": [f for f in ("amx_bf16", "avx512_bf16") if f in flags]}


def emit(result, out=None):
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def swarm_peer_args(cohort, run_dir, listen, peers, partition, start_with, group_size, steps, matchmaking_s,
                    averaging_timeout_s, dist_timeout_s, bootstrap=None, extra=()):
    """`cohort train` for one swarm peer of a benchmark: one worker on one thread, training partition
    `partition` of `peers` (swarm.sampler=partition), without evaluation, a line per step, listening on
    `listen` (HOST:PORT) and joining through `bootstrap` (None for the first peer). `extra` holds the
    model and data settings, which differ by benchmark; a later value of a key wins."""
    args = [cohort, "train", "--run-dir", run_dir, "--nproc-per-node", "1", "amp.precision=fp32",
            "dist.strategy=swarm", "swarm.insecure=true", f"swarm.listen={listen}", "swarm.sampler=partition",
            f"swarm.partitions={peers}", f"swarm.partition={partition}", f"swarm.min_peers_to_start={start_with}",
            f"swarm.group_size={group_size}", f"swarm.matchmaking_s={matchmaking_s}",
            f"swarm.averaging_timeout_s={averaging_timeout_s}", f"train.max_steps={steps}", "train.epochs=1000",
            "train.threads=1", "eval.enabled=false", "log.every_steps=1", "log.progress=plain",
            f"dist.timeout_s={dist_timeout_s}"]
    if bootstrap:
        args.append(f"swarm.initial_peers={bootstrap}")
    return args + list(extra)


# "Machines" that are network namespaces on one bridge, for bench/cost_model.py (links shaped with tc's tbf)
# and bench/scale.py --netns (an address a peer). Root only.
def _ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def netns_bridge(hub):
    """A namespace `hub` holding the bridge br0 that the machines' links plug into."""
    _ip("netns", "add", hub)
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")


def netns_machine(hub, name, dev, index, cidr, rate=None, burst=None):
    """A namespace `name` with one veth, `dev`-v`index` in it holding `cidr` and `dev`-h`index` on `hub`'s
    bridge; with `rate` (as tc writes it: 1gbit), tbf shapes both ends to it with a bucket of `burst`
    bytes (netem is missing on these machines)."""
    inside, outside = f"{dev}-v{index}", f"{dev}-h{index}"
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("link", "add", inside, "netns", name, "type", "veth", "peer", "name", outside, "netns", hub)
    _ip("-n", name, "addr", "add", cidr, "dev", inside)
    _ip("-n", name, "link", "set", inside, "up")
    _ip("-n", hub, "link", "set", outside, "master", "br0")
    _ip("-n", hub, "link", "set", outside, "up")
    if rate:
        for where, link in ((name, inside), (hub, outside)):
            _ip("netns", "exec", where, "tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", rate, "burst",
                str(burst), "latency", "400ms")


def netns_delete(names):
    for name in names:
        subprocess.run(["ip", "netns", "del", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
