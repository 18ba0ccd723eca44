#!/usr/bin/env python3
"""A latency-bandwidth (alpha-beta) cost model of cohort's collectives, fitted on network-namespace
"machines" and checked against the measurements it was not fitted on; then its predictions for clusters
and swarms this machine cannot hold (docs/scaling.md, "A cost model").

Machines: N network namespaces on a bridge in a hub namespace, each veth shaped with tc's tbf qdisc in
both directions (netem is missing on these machines): a switch with one NIC of the given rate per
machine. Each machine runs one rank of build/bench/collectives (cohort's Gloo engine, one thread).

Model, for a buffer of n bytes on p ranks (the ring algorithms Gloo runs):
    all_reduce       t = 2 (p-1) alpha + (2 (p-1)/p n - b) / B
    reduce_scatter   t =   (p-1) alpha +   ((p-1)/p n - b) / B
    all_gather       t =   (p-1) alpha +   ((p-1)/p n - b) / B
b is the tbf bucket (burst_for: a millisecond at the rate, at least 16 KiB), which the first bytes after
the barrier pass at once; a NIC has none, so the predictions for clusters take b = 0.
alpha is a message's fixed cost (software and wire), B the link's rate as the ranks see it. Both are
fitted, per link rate, on the --fit-on counts only (default: 2 machines); every other count is a
prediction, and the JSON holds each one's error. Latency added by real distance is not modelled here:
tbf adds none, so the latency-bound predictions for a real network are marked unchecked.

The host floor: the same collectives once more on the same namespaces with no tbf, so that the links are
as fast as this host can move bytes between them. A check where the host alone takes at least
HOST_BOUND of the predicted time measures the host's cores (ranks outnumber them past 2 machines here),
not the link, and is reported apart as host-bound rather than counted for or against the model.

--swarm-machines 2,4,8 also runs that many swarm peers (`cohort train`, dist.strategy=swarm), one a
machine and all in one group, on the same links, and checks each averaging round (the butterfly) against
the all-reduce's model with the all-reduce's alpha and B plus a software term (gamma) fitted on the
2-machine swarm at the fastest rate: the prediction the swarm and DiLoCo rows below rest on.
--swarm-grid 8:4 runs 8 peers, one a machine, in groups of 4 (swarm.group_size) that change from round
to round, and checks their rounds, the gradients' and the weights' averaging after them, against a group
of 4's butterfly with the same gamma: the mixing across groups that bounded groups pay for.

Needs root (ip netns, tc). Prints JSON; --out writes it.
Run: sudo python3 bench/cost_model.py --collectives build/bench/collectives --out bench/results/cost_model.json
The swarm's check alone (fitted on 2 machines' collectives):
     sudo python3 bench/cost_model.py --machines 2 --swarm-machines 2,4,8 --out bench/results/cost_model_swarm.json
The grid's rounds beside one group's: --machines 2 --no-host-floor --swarm-machines 2,4 --swarm-grid 8:4
Only the predictions (no root, no measuring): python3 bench/cost_model.py --predict-only"""
import argparse, json, math, os, platform, secrets, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import emit, netns_bridge, netns_delete, netns_machine, swarm_peer_args  # noqa: E402

HUB = "ccm-hub"
MAX_MACHINES = 8


def ns(i):
    return f"ccm-{i}"


def addr(i):
    return f"10.80.0.{i + 1}"


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def teardown():
    netns_delete([ns(i) for i in range(MAX_MACHINES)] + [HUB])


def burst_for(rate):
    """tbf's bucket: a millisecond at the rate, at least 16 KiB. A larger bucket lets a small message pass
    at the veth's own speed, which a real NIC at that rate does not."""
    bits = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in bits.items():
        if rate.endswith(unit):
            return max(16 * 1024, int(float(rate[:-len(unit)]) * scale / 8 / 1000))
    raise SystemExit(f"rate {rate!r}: give it as tc does, e.g. 1gbit or 100mbit")


def setup(machines, rate):
    """A bridge in the hub namespace; each machine's veth shaped to `rate` each way, or not at all with
    `rate` None (the host floor: the links as fast as the host moves bytes)."""
    teardown()
    netns_bridge(HUB)
    for i in range(machines):
        netns_machine(HUB, ns(i), "ccm", i, addr(i) + "/24", rate, burst_for(rate) if rate else None)


def run_collectives(a, machines, rate, port):
    """One rank of build/bench/collectives per machine; rank 0's JSON. `rate` None: the host floor, every
    size either rate measures."""
    if rate is None:
        max_bytes = max(a.max_bytes_1gbit, a.max_bytes_slow)
    else:
        max_bytes = a.max_bytes_1gbit if rate.endswith("gbit") else a.max_bytes_slow
    env = dict(os.environ, WORLD_SIZE=str(machines), MASTER_ADDR=addr(0), MASTER_PORT=str(port),
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", COHORT_TOKEN=secrets.token_hex(32), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(["ip", "netns", "exec", ns(i), a.collectives, "--max-bytes", str(max_bytes),
                               "--seconds-per-size", str(a.seconds_per_size), "--idle-ms", str(a.idle_ms)],
                              env=dict(env, RANK=str(i)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(machines)]
    outs = [p.communicate(timeout=1800) for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"collectives on {machines} machines at {rate or 'no tbf'} failed:\n" +
                 "\n".join(err[-2000:] for _, err in outs))
    return json.loads(outs[0][0].strip().splitlines()[-1])["results"]


# The swarm's butterfly over the same links: torchvision's ResNet-18 (a 1-channel stem, 10 classes) has
# 11,175,370 parameters, so a round averages 44.7 MB of fp32 gradients, bandwidth-bound at both rates.
SWARM_MODEL = {"name": "resnet18", "params": 11_175_370}


def run_swarm(a, peers, rate, port, group_size=0):
    """One swarm of `peers` peers, one a machine, all in one group (swarm.group_size=0) or in groups of
    `group_size` on the grid, averaging SWARM_MODEL's fp32 gradients (swarm.compress=none) over the shaped
    links: each averaging round's seconds (swarm_averaging_seconds: the peer's part sent to every other
    member, the others' parts reduced, the results back) and the averaging bytes a peer sent per round;
    in groups, also the weights' round after it (swarm_state_seconds, fp32 weights every step: the
    default). Only rounds of a full group count. The first two rounds meet peers still starting, so they
    are left out."""
    work = tempfile.mkdtemp(prefix="cohort-ccm-swarm-")
    procs = []
    full = group_size or peers
    for i in range(peers):
        args = swarm_peer_args(a.cohort, os.path.join(work, f"p{i}"), f"{addr(i)}:{port}", peers, i, peers,
                               group_size=group_size, steps=a.swarm_steps, matchmaking_s=a.swarm_matchmaking_s,
                               averaging_timeout_s=120, dist_timeout_s=600,
                               bootstrap=f"{addr(0)}:{port}" if i else None,
                               extra=[f"model.name={SWARM_MODEL['name']}", "data.image_size=32", "data.batch_size=16",
                                      "data.augment=false", "train.channels_last=false", "swarm.compress=none",
                                      "ckpt.save_best=false"])
        # Into a file each: a pipe read only after the others' would stall a peer that writes more than it holds.
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns(i)] + args, stdout=open(os.path.join(work, f"out{i}.txt"), "w"),
                                      stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")))
    try:
        for p in procs:
            p.wait(timeout=1800)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode != 0 for p in procs):
        tails = [open(os.path.join(work, f"out{i}.txt"), errors="replace").read()[-2000:] for i in range(peers)]
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(f"the swarm of {peers} at {rate} failed:\n" + "\n".join(tails))
    seconds, state, sent, sizes = [], [], [], {}
    for i in range(peers):
        d = os.path.join(work, f"p{i}")
        s = json.load(open(os.path.join(d, "summary.json")))
        whole = True  # every round of this peer's was a full group: its bytes a round are comparable
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for r in map(json.loads, f):
                if "swarm_group_size" not in r:
                    continue
                g = int(r["swarm_group_size"])
                whole = whole and g == full
                if r.get("step", 0) <= 2:
                    continue
                sizes[g] = sizes.get(g, 0) + 1
                if g == full:
                    seconds.append(r["swarm_averaging_seconds"])
                    if group_size and r.get("swarm_state_seconds"):
                        state.append(r["swarm_state_seconds"])
        if s["swarm_rounds"] and whole:
            # In groups a round also averages the weights, as many bytes as the gradients: a bytes' round is either.
            rounds = s["swarm_rounds"] + (s.get("swarm_state_rounds", 0) if group_size else 0)
            sent.append((s["swarm_bytes_sent"] - s.get("swarm_record_bytes_sent", 0)) / rounds)
    shutil.rmtree(work, ignore_errors=True)
    seconds.sort()
    state.sort()
    out = {"peer_rounds_by_group_size": {str(k): v for k, v in sorted(sizes.items())}, "rounds": len(seconds),
           "group_size": group_size}
    if seconds:
        out.update({"averaging_s_median": statistics.median(seconds),
                    "averaging_s_p90": seconds[int(0.9 * (len(seconds) - 1))],
                    "averaging_bytes_sent_per_peer_per_round": statistics.mean(sent) if sent else None})
    else:
        print(f"the swarm of {peers} at {rate}: no round of a full group after step 2 ({sizes})", file=sys.stderr)
    if state:
        out.update({"state_rounds": len(state), "state_s_median": statistics.median(state),
                    "state_s_p90": state[int(0.9 * (len(state) - 1))]})
    return out


def swarm_key(key):
    """swarm_measured's keys: "8", 8 machines in one group; "8g4", 8 machines in groups of 4 on the grid."""
    machines, _, group = key.partition("g")
    return int(machines), int(group or 0)


def swarm_checks(check_result, swarm_measured, cores, swarm_floor=None):
    """The butterfly moves what a ring all-reduce moves: a member sends (g-1)/g of the vector to the
    others' parts and (g-1)/g back as results, so its wire time is the all-reduce's model with the
    all-reduce's alpha and B (fitted on 2 machines of Gloo, never on a swarm). Unlike Gloo's ring, a
    swarm frame is also sealed and opened (a MAC over all of it) and copied on the way in and out, on the
    training thread and the transport's, so the round adds gamma seconds for each byte a member sends
    (and as many received), one after the other with the wire at 2 machines (one frame each way a
    phase). gamma is fitted once, on the 2-machine swarm at the fastest rate (where it shows most);
    every other swarm row is a check. With more peers than this machine's cores the peers' software
    shares them: the software term is multiplied by peers / cores there (a machine with a core a peer
    has 1). Bytes are checked too: 2 (g-1)/g of the vector, against what the peers counted. As for the
    collectives, a check whose round with no tbf (`swarm_floor`, the host floor) takes HOST_BOUND of its
    prediction or more measures this host's cores, and is set apart."""
    rows, n = [], 4 * SWARM_MODEL["params"]
    fits = {rate: (check_result or {}).get(rate, {}).get("ops", {}).get("all_reduce") for rate in swarm_measured or {}}
    rates = [r for r in fits if fits[r] and "2" in swarm_measured[r]]
    rates = [r for r in rates if "averaging_s_median" in swarm_measured[r]["2"]]
    if not rates:
        return None
    fast = max(rates, key=lambda r: fits[r]["bandwidth_bytes_per_s"])
    two = swarm_measured[fast]["2"]["averaging_s_median"]
    wire_two = predict("all_reduce", 2, n, fits[fast]["alpha_s"], fits[fast]["bandwidth_bytes_per_s"],
                       fits[fast].get("burst_bytes", 0))
    gamma = max(two - wire_two, 0.0) / n  # 2 (g-1)/g n = n bytes sent at g = 2
    for rate, by_count in swarm_measured.items():
        if not fits.get(rate):
            continue
        for key, m in sorted(by_count.items(), key=lambda x: swarm_key(x[0])):
            machines, group = swarm_key(key)
            g = group or machines
            # A group's members share the host's cores with every other group's.
            software = gamma * 2 * (g - 1) / g * n * max(1.0, machines / cores)
            wire = predict("all_reduce", g, n, fits[rate]["alpha_s"], fits[rate]["bandwidth_bytes_per_s"],
                           fits[rate].get("burst_bytes", 0))
            pred = wire + software
            # One group of all averages the gradients; groups on the grid average the weights after them too.
            for what, med, p90, count in (("gradients", "averaging_s_median", "averaging_s_p90", "rounds"),
                                          ("weights", "state_s_median", "state_s_p90", "state_rounds")):
                if med not in m:
                    continue
                sent = m["averaging_bytes_sent_per_peer_per_round"]
                host_s = (swarm_floor or {}).get(key, {}).get(med)
                rows.append({"machines": machines, "group_size": g, "averages": what, "link": rate, "vector_bytes": n,
                             "rounds": m[count], "measured_s": m[med], "measured_s_p90": m[p90],
                             "predicted_wire_s": wire, "predicted_software_s": software, "predicted_s": pred,
                             "error": pred / m[med] - 1, "error_wire_only": wire / m[med] - 1,
                             "fitted": rate == fast and key == "2", "bytes_sent_per_round": sent,
                             "host_floor_s": host_s, "host_bound": host_s is not None and host_s >= HOST_BOUND * pred,
                             "predicted_bytes": 2 * (g - 1) / g * n,
                             "bytes_error": 2 * (g - 1) / g * n / sent - 1 if sent else None})
    held = [r for r in rows if not r["fitted"] and not r["host_bound"]]
    host_bound = [r for r in rows if not r["fitted"] and r["host_bound"]]
    return {"model": SWARM_MODEL, "gamma_s_per_byte": gamma, "gamma_fitted_on": f"2 machines at {fast}",
            "cores": cores, "rows": rows, "checks": len(held),
            "within_20pct": sum(abs(r["error"]) <= 0.2 for r in held),
            "max_abs_error": max((abs(r["error"]) for r in held), default=None),
            "host_bound": {"checks": len(host_bound), "within_20pct": sum(abs(r["error"]) <= 0.2 for r in host_bound)}}


# --- the model ------------------------------------------------------------------------------------------

def coefficients(op, p):
    """(messages on the critical path, fraction of the buffer each link carries) for a ring."""
    if op == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p
    return p - 1, (p - 1) / p  # reduce_scatter, all_gather


def predict(op, p, n, alpha, bandwidth, burst=0):
    """`burst`: the bytes a link's tbf bucket passes at once after the ranks' barrier left it idle (the
    namespaces' links only; a NIC has none, and the cluster predictions pass 0). A link busy for the whole
    collective refills it no faster than it drains, so it saves its bytes once."""
    lat, frac = coefficients(op, p)
    return lat * alpha + max(0.0, frac * n - burst) / bandwidth


def fit(points, burst=0):
    """alpha and B the way Hockney's model is read off a ping-pong: alpha from the smallest buffer's time,
    B from the largest's (each with the other term taken out). Every buffer in between is then a check of
    the model, not a point it was bent to. `burst` is predict's, set by the link, not fitted."""
    small = min(points, key=lambda x: x[2])
    large = max(points, key=lambda x: x[2])
    lat_l, frac_l = coefficients(large[0], large[1])
    lat_s, frac_s = coefficients(small[0], small[1])
    alpha = small[3] / lat_s  # first guess: all latency
    for _ in range(20):  # two equations, two unknowns: a few fixed-point rounds settle them
        bandwidth = max(frac_l * large[2] - burst, 1.0) / max(large[3] - lat_l * alpha, 1e-9)
        alpha = max(small[3] - max(0.0, frac_s * small[2] - burst) / bandwidth, 0.0) / lat_s
    return alpha, bandwidth


# A check is host-bound when the same collective with no tbf (the host floor) takes at least this share
# of the predicted time: the host's cores then set the time as much as the link does, and the 20% the
# check allows cannot tell the two apart. At 8 machines on 2 cores a 1 MiB all-reduce took 24 ms with no
# tbf, where the model gives 17 ms for a 1 Gbit/s link; at 4 MiB, 33 against 63 (2026-12-07,
# bench/results/cost_model_host_floor_back_to_back.json).
HOST_BOUND = 0.8


def check(measured, fit_on, host_floor=None):
    """Per link rate and collective: alpha and B fitted on the fit_on counts, and every other count's
    predictions beside the measurements, each with its host floor where one was measured. Each collective
    gets its own pair: Gloo's ring all-reduce pipelines its chunks and reaches 95% of the link, while its
    all-gather and LibTorch 1.13's reduce-scatter (a direct exchange, GlooCommunicator.cpp) send whole
    chunks and reach less."""
    floor = {(int(p), r["op"], r["bytes"]): r["median_s"] for p, rs in (host_floor or {}).items() for r in rs}
    out = {}
    for rate, by_count in measured.items():
        out[rate] = {"fit_on_machines": sorted(fit_on), "ops": {}, "rows": []}
        burst = burst_for(rate)
        ops = sorted({r["op"] for rs in by_count.values() for r in rs})
        for op in ops:
            points = [(op, int(p), r["bytes"], r["median_s"]) for p, rs in by_count.items() if int(p) in fit_on
                      for r in rs if r["op"] == op]
            alpha, bandwidth = fit(points, burst)
            min_bytes, max_bytes = min(x[2] for x in points), max(x[2] for x in points)
            out[rate]["ops"][op] = {"alpha_s": alpha, "bandwidth_bytes_per_s": bandwidth, "burst_bytes": burst}
            for p, rs in by_count.items():
                for r in rs:
                    if r["op"] != op:
                        continue
                    pred = predict(op, int(p), r["bytes"], alpha, bandwidth, burst)
                    lat, _ = coefficients(op, int(p))
                    fitted = int(p) in fit_on and r["bytes"] in (min_bytes, max_bytes)
                    host_s = floor.get((int(p), op, r["bytes"]))
                    # Bandwidth-bound: the latency term is under a fifth of the prediction.
                    out[rate]["rows"].append({"machines": int(p), "op": op, "bytes": r["bytes"],
                                              "measured_s": r["median_s"], "predicted_s": pred,
                                              "error": pred / r["median_s"] - 1, "fitted": fitted,
                                              "bandwidth_bound": lat * alpha < 0.2 * pred, "host_floor_s": host_s,
                                              "host_bound": host_s is not None and host_s >= HOST_BOUND * pred})
        host_bound = [x for x in out[rate]["rows"] if not x["fitted"] and x["host_bound"]]
        out[rate]["host_bound"] = {"points": len(host_bound),
                                   "within_20pct": sum(abs(x["error"]) <= 0.2 for x in host_bound)}
        held = [x for x in out[rate]["rows"] if not x["fitted"] and not x["host_bound"]]
        for op in ops:
            mine = [x for x in held if x["op"] == op and x["bandwidth_bound"]]
            out[rate]["ops"][op]["bandwidth_bound_checks"] = {
                "points": len(mine), "within_20pct": sum(abs(x["error"]) <= 0.2 for x in mine),
                "max_abs_error": max((abs(x["error"]) for x in mine), default=None)}
        for name, rows in (("bandwidth_bound", [x for x in held if x["bandwidth_bound"]]),
                           ("latency_bound", [x for x in held if not x["bandwidth_bound"]])):
            out[rate][name] = {"points": len(rows), "within_20pct": sum(abs(x["error"]) <= 0.2 for x in rows),
                               "max_abs_error": max((abs(x["error"]) for x in rows), default=None)}
    return out


# --- predictions past this machine ----------------------------------------------------------------------

# Everything below is assumption, stated so that it can be argued with; only the formulas were checked
# here (on the namespaces above). Parameter counts are torchvision's. A step's compute is measured, fp16
# at batch 256 on one H200 (bench/gpu_compare.py): ResNet-50 5,847 images/s, ViT-B/32 6,067.
MODELS = {
    "resnet50": {"params": 25_557_032, "step_s_at_256": 256 / 5847.1, "source": "bench/results/gpu_resnet50.json"},
    "vit_b_32": {"params": 88_224_232, "step_s_at_256": 256 / 6066.6, "source": "bench/results/gpu_vit_b32.json"},
}
CLUSTER = {
    "gpus_per_node": 8,
    # NVLink 4 on H100/H200 SXM: 450 GB/s each way per GPU; NCCL reaches about 80% of it in all-reduce.
    "nvlink_bytes_per_s": 0.8 * 450e9,
    # One NIC per GPU (a rail-optimized fabric, as on DGX H100): the rate is each GPU's.
    "alpha_s": 5e-6,  # per message across the fabric (InfiniBand or RoCE), unchecked here
    "link_efficiency": None,  # taken from the fit: what cohort's ring reached of the 1 Gbit/s link
    "bucket_bytes": 25 << 20,
    "backward_share": 2 / 3,  # backward is about twice the forward's work
}


def allreduce_cluster(n, gpus, link_bytes_per_s, c):
    """NCCL's shape for a node of 8 GPUs: reduce-scatter inside the node over NVLink, an all-reduce of
    each GPU's 1/8 across nodes over that GPU's NIC, an all-gather inside the node. The latency term is a
    ring's (2 (nodes-1) messages); NCCL's trees bring it to about 2 log2(nodes)."""
    g = min(gpus, c["gpus_per_node"])
    nodes = gpus // g
    inside = 2 * (g - 1) / g * n / c["nvlink_bytes_per_s"]
    across = 0.0
    if nodes > 1:
        across = 2 * (nodes - 1) / nodes * (n / g) / (c["link_efficiency"] * link_bytes_per_s)
        across += 2 * (nodes - 1) * c["alpha_s"]
    return inside + across


def ddp_step(model, batch, gpus, link_gbit, c, fsdp=False):
    """Step time with ddp's buckets overlapped with backward (fsdp: its gathers with forward and backward
    too): compute, plus what of the collectives the work does not hide, and at least the last bucket's,
    which nothing hides."""
    m = MODELS[model]
    compute = m["step_s_at_256"] * batch / 256
    n = 4 * m["params"]  # fp32 gradients (and fsdp's fp32 parameters)
    rate = link_gbit * 1e9 / 8
    ar = allreduce_cluster(n, gpus, rate, c)
    last = allreduce_cluster(min(n, c["bucket_bytes"]), gpus, rate, c)
    if fsdp:  # all-gather twice (forward, backward) and reduce-scatter once: 1.5 all-reduces' bytes
        comm, hidden_by = 1.5 * ar, compute
    else:
        comm, hidden_by = ar, c["backward_share"] * compute
    step = compute + max(last, comm - hidden_by)
    return {"model": model, "strategy": "fsdp" if fsdp else "ddp", "gpus": gpus, "link_gbit": link_gbit,
            "batch_per_gpu": batch, "compute_s": compute, "collectives_s": comm, "step_s": step,
            "scaling_efficiency": compute / step}


def swarm_round(n_bytes, group, link_bytes_per_s, efficiency, matchmaking_s, rtt_s, gamma_s_per_byte):
    """One swarm round: matchmaking, then the butterfly inside a group of `group` (each member sends and
    receives 2 (g-1)/g of the vector, in two message steps of a round trip each), plus the software's
    gamma for each byte sent (swarm_checks: sealing, opening and copying frames; a core a peer)."""
    sent = 2 * (group - 1) / group * n_bytes
    return matchmaking_s + sent / (efficiency * link_bytes_per_s) + sent * gamma_s_per_byte + 2 * rtt_s


def swarm_predictions(c):
    """The swarm and DiLoCo at 100 and 1,000 peers on 100 Mbit/s: ResNet-50, one H200-class GPU per peer,
    local batch 256. Groups are bounded (swarm.group_size), so a round costs the same at 100 and 1,000
    peers; what grows is how many rounds a change needs to reach every peer (log_g of the peers, Moshpit
    SGD's grid). In bounded groups the round's group also averages its weights, in fp32 whatever the
    gradients' codec, with no matchmaking of its own (SwarmPeer::average_state): every step for the swarm,
    every 10 outer rounds for DiLoCo's outer weights and momentum (swarm.average_state_every's defaults)."""
    m = MODELS["resnet50"]
    rate, eff, rtt = 100e6 / 8, c["link_efficiency"], 0.05  # 50 ms round trip between sites: unchecked
    gamma = c["swarm_gamma_s_per_byte"]
    rows = []
    for peers in (100, 1000):
        for group in (16, 64):
            mix = math.ceil(math.log(peers) / math.log(group))
            # swarm: gradients in fp16 once per global step, then the weights in fp32. A peer computes while
            # the others fill the target batch, so a round pays for target_batch_size / peers samples of each
            # peer's compute; the target batch at which half a peer's time is compute is where the swarm
            # stops working.
            grad = swarm_round(2 * m["params"], group, rate, eff, 5.0, rtt, gamma)
            weights = swarm_round(4 * m["params"], group, rate, eff, 0.0, rtt, gamma)
            step = grad + weights
            per_sample = m["step_s_at_256"] / 256
            rows.append({"system": "swarm (compress fp16, weights every step)", "peers": peers, "group_size": group,
                         "rounds_to_mix": mix, "gradient_round_s": grad, "weights_round_s": weights,
                         "round_s": step, "target_batch_for_half_compute": peers * step / per_sample,
                         "utilization_at_target_batch_65536": (65536 / peers * per_sample) /
                                                              (65536 / peers * per_sample + step)})
            # DiLoCo: the parameters' change in int8 once every 500 inner steps of 256 samples, and the outer
            # weights and momentum in fp32 (8 bytes a parameter) once every 10 outer rounds
            outer = swarm_round(m["params"], group, rate, eff, 5.0, rtt, gamma)
            state = swarm_round(8 * m["params"], group, rate, eff, 0.0, rtt, gamma) / 10
            compute = 500 * m["step_s_at_256"]
            rows.append({"system": "diloco (inner_steps 500, compress int8, outer state every 10 rounds)",
                         "peers": peers, "group_size": group, "rounds_to_mix": mix, "outer_round_s": outer,
                         "state_round_s_amortized": state, "round_s": outer + state, "compute_s_per_round": compute,
                         "utilization": compute / (compute + outer + state)})
    return rows


def background_traffic(runs_json):
    """The directory's bytes a peer sends a step while training, as the sum of its parts (docs/scaling.md,
    "Where it stops, and why"), checked against bench/scale.py's swarm in groups of g = 8:

        bytes a step = A (g - 1) / 7 + B step_s + (N - 1) / g D(g)

    A: the changes within the key (a step and a readiness to each of its g - 1 peers); B: what goes by the
    second (the gossip's heartbeats, and those of moments no deal vouches for the peer); the deals: one a
    group a step, from its leader to every other peer, of D(g) = D(8) + 40 (g - 8) bytes (a member's key
    and its next group key). A and B are fitted on the smallest and largest counts, D(8) on the next
    smallest; the other counts are checks the fit never saw. Carried to 100 and 1,000 peers at a step a
    second, and to a swarm whose rounds are slower than the deals' vouching lasts (about a second). There
    each leader re-sends its deal every 0.75 s until its next round, and each member sends its heartbeat
    to its leader too (Note [A leader vouches for its members until its next round]): the deals' bytes
    of a step a second, 1 / 0.75 times, and a record frame a second; before, the heartbeat went to every
    peer outside the key each second (slow_rounds_before_*)."""
    try:
        rows = sorted((r for r in json.load(open(runs_json))["model_runs"]["runs"] if r["group_size"] == 8),
                      key=lambda r: r["peers"])
    except (OSError, KeyError, ValueError):
        return None
    if len(rows) < 4:
        return None
    g = 8

    def parts(r):
        total = r["record_bytes_per_peer_per_step_training"]
        step_s = total / r["record_bytes_per_peer_per_s_training"]
        return total - r["deal_bytes_per_peer_per_step_training"], step_s, r["deal_bytes_per_peer_per_step_training"]

    (y0, s0, _), (y1, s1, _) = parts(rows[0]), parts(rows[-1])
    b = (y1 - y0) / (s1 - s0)
    a = y0 - b * s0
    deal_frame = parts(rows[1])[2] * g / (rows[1]["peers"] - 1)
    checks = []
    for r in rows[1:-1]:
        rest, step_s, deals = parts(r)
        predicted = a + b * step_s + (r["peers"] - 1) / g * deal_frame
        measured = r["record_bytes_per_peer_per_step_training"]
        checks.append({"peers": r["peers"], "step_s": step_s, "measured_bytes_per_step": measured,
                       "predicted_bytes_per_step": predicted, "error": predicted / measured - 1,
                       "measured_deal_bytes_per_step": deals,
                       "predicted_deal_bytes_per_step": (r["peers"] - 1) / g * deal_frame})
    record_frame = a / (2 * (g - 1))
    predicted = []
    for peers in (100, 1000):
        for group in (16, 64):
            deals = (peers - 1) / group * (deal_frame + 40 * (group - g))
            per_s = a * (group - 1) / (g - 1) + b + deals
            # Rounds slower than a second: the changes within the key come once a round (counted here as
            # once a second, an upper bound), the deals every 0.75 s, and a heartbeat to the leader.
            slow = per_s - deals + deals / 0.75 + record_frame
            slow_before = per_s + (peers - group) * record_frame
            predicted.append({"peers": peers, "group_size": group, "step_s": 1.0,
                              "bytes_per_peer_per_s": per_s, "deal_bytes_per_peer_per_s": deals,
                              "deal_frames_per_peer_per_step": (peers - 1) / group,
                              "share_of_100mbit": per_s * 8 / 100e6,
                              "slow_rounds_bytes_per_peer_per_s": slow,
                              "slow_rounds_share_of_100mbit": slow * 8 / 100e6,
                              "slow_rounds_before_bytes_per_peer_per_s": slow_before,
                              "slow_rounds_before_share_of_100mbit": slow_before * 8 / 100e6})
    return {"source": os.path.relpath(runs_json, os.path.dirname(HERE)), "group_size": g,
            "fitted_on_peers": [rows[0]["peers"], rows[-1]["peers"], rows[1]["peers"]],
            "changes_within_key_bytes_per_step_A": a, "bytes_per_s_B": b, "deal_frame_bytes_D8": deal_frame,
            "record_frame_bytes": record_frame, "checks": checks, "predicted": predicted}


SLOW_NETWORK_BURST = 256 * 1024  # bench/slow_network.py's tbf bucket ("256kb")


def step_checks(check_result):
    """The step model (compute, plus the all-reduce the backward does not hide) against whole ddp steps
    measured over the same kind of link, which the fit never saw: bench/slow_network.py's ResNet-18 on
    two namespaces at 100 Mbit/s. Its compute is taken from the PowerSGD run of the same job (0.3 MB a
    step on the wire: about 30 ms of it is communication, so the compute is slightly overstated)."""
    fitted = (check_result or {}).get("100mbit", {}).get("ops", {}).get("all_reduce")
    try:
        sn = json.load(open(os.path.join(HERE, "results", "slow_network.json")))
    except (OSError, ValueError):
        return None
    if not fitted:
        return None
    compute = sn["runs"]["powersgd rank 2"]["step_seconds"]
    rows = []
    for run in ("none", "fp16"):
        n = sn["runs"][run]["sync_bytes_per_step"]
        comm = predict("all_reduce", 2, n, fitted["alpha_s"], fitted["bandwidth_bytes_per_s"], SLOW_NETWORK_BURST)
        # dist.bucket_mb counts gradient bytes before compression: a bucket on the wire is that share.
        wire = CLUSTER["bucket_bytes"] * n / sn["runs"][run]["sync_bytes_per_step_uncompressed"]
        last = predict("all_reduce", 2, min(n, wire), fitted["alpha_s"], fitted["bandwidth_bytes_per_s"],
                       SLOW_NETWORK_BURST)
        pred = compute + max(last, comm - CLUSTER["backward_share"] * compute)
        meas = sn["runs"][run]["step_seconds"]
        rows.append({"run": f"resnet18, 2 machines, 100mbit, compress {run}", "bytes": n, "measured_s": meas,
                     "predicted_s": pred, "error": pred / meas - 1})
    return rows


def link_efficiency(measured):
    """What cohort's ring all-reduce reached of the link at its largest buffer, the lowest over rates and
    machine counts (bus bandwidth, as nccl-tests counts it: 2 (p-1)/p n / t, over the link's rate)."""
    rates = {"gbit": 1e9 / 8, "mbit": 1e6 / 8}
    eff = []
    for rate, by_count in (measured or {}).items():
        link = float(rate[:-4]) * rates[rate[-4:]]
        for p, rs in by_count.items():
            big = max((r for r in rs if r["op"] == "all_reduce"), key=lambda r: r["bytes"])
            eff.append(2 * (int(p) - 1) / int(p) * big["bytes"] / big["median_s"] / link)
    return min(eff) if eff else 0.9


def swarm_gamma(swarm_check):
    """The swarm's software cost per byte sent: this run's fit, else the last swarm check's JSON, else 0
    (and the predictions say which)."""
    if swarm_check:
        return swarm_check["gamma_s_per_byte"], "this run's swarm check"
    path = os.path.join(HERE, "results", "cost_model_swarm.json")
    try:
        return json.load(open(path))["swarm_check"]["gamma_s_per_byte"], os.path.relpath(path, os.path.dirname(HERE))
    except (OSError, KeyError, TypeError, ValueError):
        return 0.0, "none measured: the software term is left out"


def predictions(measured, swarm_check=None):
    c = dict(CLUSTER)
    c["link_efficiency"] = link_efficiency(measured)
    c["swarm_gamma_s_per_byte"], c["swarm_gamma_source"] = swarm_gamma(swarm_check)
    rows = []
    for model in [m for m in MODELS if MODELS[m]["step_s_at_256"]]:
        for link in (100, 400):
            for gpus in (8, 64, 512, 1024):
                for batch in (256, 32):
                    rows.append(ddp_step(model, batch, gpus, link, c))
                    rows.append(ddp_step(model, batch, gpus, link, c, fsdp=True))
    return {"assumptions": {k: v for k, v in c.items()}, "models": MODELS, "cluster": rows,
            "swarm": swarm_predictions(c),
            "swarm_background": background_traffic(os.path.join(HERE, "results", "deal_vouches.json"))}



def self_test():
    """The model's arithmetic on measurements it made up itself (ctest Bench.CostModelArithmetic): the fit
    reads alpha and B back with the links' bucket counted, every check it was not fitted on is then exact,
    and a check whose host floor is past HOST_BOUND of its prediction is set apart, not counted."""
    alpha, bandwidth, rate = 200e-6, 100e6, "1gbit"
    ops, sizes = ("all_reduce", "reduce_scatter", "all_gather"), (4096, 1 << 20, 64 << 20)
    measured = {rate: {str(p): [{"op": op, "bytes": n, "median_s": predict(op, p, n, alpha, bandwidth, burst_for(rate))}
                                for op in ops for n in sizes] for p in (2, 4, 8)}}
    floor = {"8": [{"op": "all_reduce", "bytes": 1 << 20, "median_s": 1.0},
                   {"op": "all_gather", "bytes": 1 << 20, "median_s": 1e-6}]}
    c = check(measured, {2}, floor)[rate]
    for op in ops:
        got = c["ops"][op]
        assert math.isclose(got["alpha_s"], alpha, rel_tol=1e-6), (op, got["alpha_s"])
        assert math.isclose(got["bandwidth_bytes_per_s"], bandwidth, rel_tol=1e-6), (op, got["bandwidth_bytes_per_s"])
    bound = [(x["machines"], x["op"], x["bytes"]) for x in c["rows"] if x["host_bound"]]
    assert bound == [(8, "all_reduce", 1 << 20)], bound
    assert all(abs(x["error"]) < 1e-6 for x in c["rows"]), [x for x in c["rows"] if abs(x["error"]) >= 1e-6]
    held = sum(not x["fitted"] for x in c["rows"])
    assert c["host_bound"]["points"] == 1
    assert c["bandwidth_bound"]["points"] + c["latency_bound"]["points"] == held - 1
    # Without the bucket a 1 MiB reduce-scatter on 2 machines is off by a quarter: what the bucket is for.
    plain = predict("reduce_scatter", 2, 1 << 20, alpha, bandwidth)
    assert plain / predict("reduce_scatter", 2, 1 << 20, alpha, bandwidth, burst_for(rate)) > 1.2
    print("cost model arithmetic: ok")


def cpu_name():
    try:
        return next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collectives", default="build/bench/collectives")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--machines", default="2,4,8")
    ap.add_argument("--fit-on", default="2", help="machine counts the model is fitted on (the rest are checks)")
    ap.add_argument("--max-bytes-1gbit", type=int, default=64 << 20)
    ap.add_argument("--max-bytes-slow", type=int, default=16 << 20, help="largest buffer below 1 Gbit/s")
    ap.add_argument("--seconds-per-size", type=float, default=2.0)
    # Long enough for a link's bucket to fill again before each repetition, as the model assumes: 16 KiB
    # at 100 Mbit/s takes 1.3 ms, 125 KB at 1 Gbit/s 1 ms. Runs before 2026-12-07 went back to back (0),
    # and a repetition found the bucket as the last had left it (docs/scaling.md, "A cost model").
    ap.add_argument("--idle-ms", type=float, default=3.0, help="each rank's idle time before a repetition")
    ap.add_argument("--port", type=int, default=29640)
    ap.add_argument("--cohort", default="build/cohort", help="for --swarm-machines")
    ap.add_argument("--swarm-machines", default="",
                    help="swarm sizes whose butterfly round is measured on the same links, e.g. 2,4,8 (none: skip)")
    ap.add_argument("--swarm-grid", default="",
                    help="MACHINES:GROUP_SIZE,...: swarms on the grid whose rounds are measured on the same links, e.g. 8:4")
    ap.add_argument("--swarm-steps", type=int, default=8)
    ap.add_argument("--swarm-matchmaking-s", type=float, default=10.0,
                    help="swarm.matchmaking_s: long enough for a record to cross a link a round saturates")
    ap.add_argument("--host-floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the collectives with no tbf, and report the checks the host sets apart")
    ap.add_argument("--from-json", help="refit and predict from an earlier --out instead of measuring")
    ap.add_argument("--predict-only", action="store_true")
    ap.add_argument("--self-test", action="store_true", help="check the model's arithmetic on made-up figures")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    a.cohort = os.path.abspath(a.cohort)
    fit_on = {int(x) for x in a.fit_on.split(",")}
    res = {"bench": "cost_model", "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
           "command": " ".join(["python3"] + sys.argv),
           "commit": sh("git", "-C", HERE, "rev-parse", "--short", "HEAD", check=False).stdout.strip(),
           "link": "N network namespaces on a bridge, tc tbf at the rate each way on every veth"}
    grid_machines = ",".join(x.split(":")[0] for x in a.swarm_grid.split(",") if x)
    if max([int(x) for x in (a.machines + "," + a.swarm_machines + "," + grid_machines).split(",") if x],
           default=0) > MAX_MACHINES:
        sys.exit(f"at most {MAX_MACHINES} machines (namespaces) here: --machines and --swarm-machines")
    if a.from_json:  # the measurement keeps the machine and commit it was taken on
        earlier = json.load(open(a.from_json))
        res.update({k: earlier[k] for k in ("machine", "commit", "measured", "host_floor", "swarm_measured",
                                            "swarm_host_floor") if k in earlier})
        res["measured_by"] = earlier.get("measured_by", earlier.get("command", "python3 bench/cost_model.py"))
    elif not a.predict_only:
        if os.geteuid() != 0:
            sys.exit("bench/cost_model.py needs root for ip netns and tc (or --predict-only)")
        res["measured"] = {}
        swarms = [(int(x), 0) for x in a.swarm_machines.split(",") if x]
        swarms += [tuple(int(y) for y in x.split(":")) for x in a.swarm_grid.split(",") if x]
        try:
            port = a.port
            for p, g in swarms if a.host_floor else []:
                setup(p, None)
                t0 = time.time()
                res.setdefault("swarm_host_floor", {})[f"{p}g{g}" if g else str(p)] = run_swarm(a, p, "no tbf", port, g)
                print(f"no tbf x {p} swarm peers{f' in groups of {g}' if g else ''}: {time.time() - t0:.0f} s",
                      file=sys.stderr)
                port += 1
            for p in [int(x) for x in a.machines.split(",")] if a.host_floor else []:
                setup(p, None)
                t0 = time.time()
                res.setdefault("host_floor", {})[str(p)] = run_collectives(a, p, None, port)
                print(f"no tbf x {p}: {time.time() - t0:.0f} s", file=sys.stderr)
                port += 1
            for rate in a.rates.split(","):
                res["measured"][rate] = {}
                for p in [int(x) for x in a.machines.split(",")]:
                    setup(p, rate)
                    t0 = time.time()
                    res["measured"][rate][str(p)] = run_collectives(a, p, rate, port)
                    print(f"{rate} x {p}: {time.time() - t0:.0f} s", file=sys.stderr)
                    port += 1
                for p, g in swarms:
                    setup(p, rate)
                    t0 = time.time()
                    res.setdefault("swarm_measured", {}).setdefault(rate, {})[f"{p}g{g}" if g else str(p)] = \
                        run_swarm(a, p, rate, port, g)
                    print(f"{rate} x {p} swarm peers{f' in groups of {g}' if g else ''}: {time.time() - t0:.0f} s",
                          file=sys.stderr)
                    port += 1
        finally:
            teardown()
    if "measured" in res:
        res["check"] = check(res["measured"], fit_on, res.get("host_floor"))
        res["step_check"] = step_checks(res["check"])
        if "swarm_measured" in res:
            res["swarm_check"] = swarm_checks(res["check"], res["swarm_measured"], res["machine"]["cores"],
                                              res.get("swarm_host_floor"))
    res["predictions"] = predictions(res.get("measured"), res.get("swarm_check"))
    emit(res, a.out)


if __name__ == "__main__":
    main()
