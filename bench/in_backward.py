#!/usr/bin/env python3
"""The optimizer inside backward (optim.in_backward) against the plain step after backward, where
communication is exposed: two "machines" as network namespaces joined by a shaped veth pair
(bench/slow_network.py's setup), one cohort worker in each, launched with --nnodes 2. In the same run,
PyTorch's DDP on the same link, model and batch with the optimizer after backward and with DDP's fused
optimizer (_register_fused_optim: each bucket stepped in the communication hook;
bench/peers/torch_ddp_in_backward.py; --no-peer skips it). Needs root (ip netns, tc). Prints JSON.

For each link, model and optimizer:
  - step_seconds of cohort plain / in-backward and of PyTorch plain / fused (train_seconds / steps);
  - cohort's optimizer phase per step in the plain run (summary.json's time_breakdown);
  - hidden_fraction = (plain step - in-backward step) / plain optimizer phase: the share of the optimizer's
    time that stepping inside backward took off the step. Near 1 where it is all hidden; noisy where the
    optimizer phase is a small share of the step (it is reported with that share);
  - hidden_fraction_measured = 1 - (bucket steps that overlapped no later bucket's reduction + step()'s own
    time) / plain optimizer phase, from the in-backward run's own accounting (summary.json's
    in_backward_exposed_seconds). A bucket step counts as exposed unless a later reduction was still under
    way when it ended, so this is a lower bound of what was hidden.
Models as cohort trains Fashion-MNIST resized to --image pixels (data.image_size), fp32, one thread per
worker, --batch images per worker. --strategy zero1, zero2 or fsdp runs cohort's sharded strategy instead
of ddp (each unit's slice stepped as its reduce-scatter ends); the peer is DDP's, so it is skipped there.

  sudo python3 bench/in_backward.py --rates 1gbit,100mbit --models resnet18,resnet50 --out bench/results/in_backward.json
  sudo python3 bench/in_backward.py --rates 1gbit --models resnet50 --strategy zero2 --steps 8
"""
import argparse, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slow_network as link  # noqa: E402  the namespaces, the veth pair and tc
from benchlib import machine  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run_cohort(a, model, optim, in_backward, port):
    args = [f"model.name={model}", f"data.image_size={a.image}", f"data.batch_size={a.batch}",
            f"train.max_steps={a.steps}", f"optim.name={optim}", f"optim.in_backward={'true' if in_backward else 'false'}",
            "eval.enabled=false", "ckpt.save_best=false", "log.every_steps=1000", "train.threads=1",
            "dist.timeout_s=300", "amp.precision=fp32", "train.channels_last=false", "data.augment=false",
            f"dist.strategy={a.strategy}"]
    s = link.train_on_two_nodes(a.cohort, port, args, f"cohort {a.strategy} {model} {optim} in_backward={in_backward}")
    seconds = s["time_breakdown"]["seconds"]
    return {"step_seconds": round(s["train_seconds"] / s["steps"], 4),
            "optimizer_seconds_per_step": round(seconds["optimizer"] / s["steps"], 4),
            "comm_seconds_per_step": round(seconds["comm"] / s["steps"], 4),
            # ddp counts buckets, the sharded strategies units.
            "in_backward_early_buckets": s.get("in_backward_early_buckets", s.get("in_backward_early_units")),
            "in_backward_hidden_seconds_per_step": per_step(s.get("in_backward_hidden_seconds"), s["steps"]),
            "in_backward_exposed_seconds_per_step": per_step(s.get("in_backward_exposed_seconds"), s["steps"])}


def per_step(total, steps):
    return None if total is None else round(total / steps, 4)


def run_peer(a, model, optim, mode, port):
    peer = os.path.join(HERE, "peers", "torch_ddp_in_backward.py")
    procs = []
    for i in range(2):
        env = dict(os.environ, RANK=str(i), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR=link.ADDR[0],
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=link.VETH[i], OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(["ip", "netns", "exec", link.NS[i], a.python, peer, "--model", model,
                                       "--optim", optim, "--mode", mode, "--steps", str(a.steps - 1),
                                       "--batch", str(a.batch), "--image", str(a.image)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    lines = [l for l in outs[0].splitlines() if l.startswith("{")]
    if not lines:
        return {"error": "\n".join(o[-1500:] for o in outs)}
    out = json.loads(lines[-1])
    # Seen with 2.14's fused optimizer: a worker ends with "terminate called without an active exception"
    # after its last step, its timing already printed. The timing stands; the exit is recorded.
    codes = [p.returncode for p in procs]
    if any(codes):
        out["exit_codes"] = codes
        out["note"] = "; ".join({l for o in outs for l in o.splitlines() if "terminate called" in l}) or "non-zero exit"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--python", default="/root/.cache/cohort/torch-2.14.1/bin/python3",
                    help="the peer's Python (torch and torchvision; the reference environment's)")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--models", default="resnet18,resnet50,vit_b32")
    ap.add_argument("--optims", default="sgd,adamw")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--strategy", default="ddp", choices=["ddp", "zero1", "zero2", "fsdp"])
    ap.add_argument("--out")
    a = ap.parse_args()
    a.cohort = os.path.abspath(a.cohort)
    if os.geteuid() != 0:
        sys.exit("bench/in_backward.py needs root for ip netns and tc")
    res = {"bench": "in_backward", "machine": machine(), "strategy": a.strategy, "link": "veth between two network namespaces, tc tbf each way",
           "data": f"fashion-mnist resized to {a.image} px, fp32, 1 thread per worker",
           "batch_per_worker": a.batch, "steps": a.steps, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "command": " ".join(sys.argv), "runs": []}
    port = 29810
    try:
        for rate in a.rates.split(","):
            link.setup(rate)
            for model in a.models.split(","):
                for optim in a.optims.split(","):
                    row = {"rate": rate, "model": model, "optim": optim}
                    for inb in (False, True):
                        port += 1
                        row["cohort_in_backward" if inb else "cohort_plain"] = run_cohort(a, model, optim, inb, port)
                    if not a.no_peer and a.strategy == "ddp":
                        for mode in ("plain", "fused"):
                            port += 1
                            row["torch_" + mode] = run_peer(a, model, optim, mode, port)
                    plain, inb = row["cohort_plain"], row["cohort_in_backward"]
                    opt = plain["optimizer_seconds_per_step"]
                    row["optimizer_share_of_plain_step"] = round(opt / plain["step_seconds"], 4)
                    row["hidden_fraction"] = round((plain["step_seconds"] - inb["step_seconds"]) / opt, 3) if opt else None
                    # Directly: what of the plain optimizer phase is still on the critical path in backward
                    # (bucket steps that overlapped no later reduction, plus step()'s own time).
                    exposed = inb.get("in_backward_exposed_seconds_per_step")
                    if exposed is not None and opt:
                        row["hidden_fraction_measured"] = round(
                            1 - (exposed + inb["optimizer_seconds_per_step"]) / opt, 3)
                    fused = row.get("torch_fused", {}).get("step_seconds")
                    if fused:
                        row["cohort_in_backward_over_torch_fused"] = round(inb["step_seconds"] / fused, 3)
                    res["runs"].append(row)
                    print(json.dumps(row), file=sys.stderr)
            link.teardown()
    finally:
        link.teardown()
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
