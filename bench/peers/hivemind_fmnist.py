"""One Hivemind peer training the shared Fashion-MNIST ResNet, for bench/swarm.py (Hivemind vs cohort's swarm).

The model, data loading and normalisation come from ../../../shared/peers/torch_ddp_fmnist.py (imported, not
copied), and so does the recipe: SGD nesterov 0.9, weight decay 5e-4, label smoothing 0.1, random horizontal
flips, OneCycleLR. The shared peer scales lr by nproc with 128 samples per worker, i.e. by global_batch / 128;
here the global batch is --target-batch-size T, so lr = 0.05 * T/128, max_lr = 0.1 * T/128, and the schedule has
one step per Hivemind global epoch (T samples swarm-wide): total_steps = --max-samples M // T.

One process = one peer = one torch thread. Each peer samples the whole training set in its own shuffled order
(seeded by --peer-index, reshuffled each pass), like cohort's swarm default; all peers start from the same
weights (torch.manual_seed(0), as the shared peer).

Usage (first peer writes its multiaddrs, the others read them):
  python3 hivemind_fmnist.py --host 10.0.0.1 --port 4000 --maddr-out /tmp/m --peer-index 0 --npeers 4 ...
  python3 hivemind_fmnist.py --host 10.0.0.2 --port 4000 --initial-peers /tmp/m --peer-index 1 --npeers 4 ...
  common: --max-samples M --batch 64 --target-batch-size 256 --matchmaking-time S --averaging-timeout S
          --eval-every-steps K --events FILE --run-id STR
Events (JSON lines, --events): one per eval {"t", "t_train", "epoch", "samples", "test_acc", "eval_s"} ("samples"
is epoch * T, the swarm's nominal count); one per opt.step() slower than --stall-s (2 s) {"t", "epoch", "stall_s"};
a final {"done": true, "wall_s", "max_step_s", "max_epoch_gap_s", "local_samples", ...} (also on SIGTERM).
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: hivemind's forked helpers inherit it too
import argparse, json, signal, sys, threading, time

import torch
import torch.nn.functional as F
import hivemind

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shared_peer import SHARED, shared_peer  # noqa: E402


def initial_peers(arg, wait_s=300):
    """Comma-separated multiaddrs, or a file the first peer writes (waited for: peers start concurrently)."""
    if not arg or arg.startswith(("/ip4/", "/ip6/", "/dns")):
        return [m for m in arg.split(",") if m]
    deadline = time.time() + wait_s
    while not (os.path.exists(arg) and os.path.getsize(arg) > 0):
        if time.time() > deadline:
            sys.exit(f"no multiaddrs in {arg} after {wait_s}s")
        time.sleep(0.2)
    return open(arg).read().split()


class Terminated(Exception):
    pass


def on_sigterm(signum, frame):
    raise Terminated()  # unwinds the training loop from wherever it is, the finally block reports and shuts down


def kill_children():
    """Last resort when shutdown hangs: SIGKILL our own descendants (hivemind's helpers and p2pd), by pid."""
    me, kids = os.getpid(), {}
    for d in os.listdir("/proc"):
        try:
            if d.isdigit():
                kids.setdefault(int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    todo, seen = [me], []
    while todo:
        for c in kids.get(todo.pop(), []):
            seen.append(c); todo.append(c)
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def compression(name):
    """hivemind.Optimizer's compression arguments: its defaults (none); half precision for both the gradients
    and the state it averages in the background, as Hivemind's own ALBERT example sets them; or its 8-bit
    quantization for the gradients (the one that runs without bitsandbytes; its blockwise one needs it), with
    the state in half precision (8 bits around the mean would blur the weights themselves)."""
    if name == "none":
        return {}
    from hivemind.compression import Float16Compression, Uniform8BitQuantization
    grads = Float16Compression() if name == "fp16" else Uniform8BitQuantization()
    return dict(grad_compression=grads, state_averaging_compression=Float16Compression())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1"); p.add_argument("--port", type=int, default=0)
    p.add_argument("--initial-peers", default=""); p.add_argument("--maddr-out", default="")
    p.add_argument("--peer-index", type=int, default=0); p.add_argument("--npeers", type=int, default=1)
    p.add_argument("--batch", type=int, default=64); p.add_argument("--target-batch-size", type=int, default=256)
    p.add_argument("--matchmaking-time", type=float, default=15.0)  # hivemind 1.1.12's defaults
    p.add_argument("--averaging-timeout", type=float, default=60.0)
    p.add_argument("--load-state-timeout", type=float, default=600.0)
    p.add_argument("--max-samples", type=int, default=60000 * 3)
    p.add_argument("--eval-every-steps", type=int, default=0); p.add_argument("--events", default="")
    p.add_argument("--run-id", default="fmnist"); p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stall-s", type=float, default=2.0, help="report opt.step() calls slower than this")
    p.add_argument("--model", choices=["resnet", "mlp"], default="resnet",
                   help="resnet: the shared peer's; mlp: cohort's model.name=mlp at its default width (784-32-32-10, "
                        "ReLU), for bench/scale.py")
    p.add_argument("--target-group-size", type=int, default=0,
                   help="the averagers' target_group_size (0: Hivemind's default, None: every ready peer)")
    p.add_argument("--start-peers", type=int, default=0,
                   help="train only once the progress tracker sees this many peers (as cohort's "
                        "swarm.min_peers_to_start), waiting at most --load-state-timeout")
    p.add_argument("--epoch-events", action="store_true", help="one event per global epoch: {\"t\", \"epoch\"}")
    p.add_argument("--compression", choices=["none", "fp16", "int8"], default="none",
                   help="fp16: Float16Compression for the gradients and the background state averaging; "
                        "int8: Uniform8BitQuantization for the gradients, Float16Compression for the state")
    a = p.parse_args()

    t0 = time.time()
    events = open(a.events, "a", buffering=1) if a.events else sys.stdout
    def emit(**kw):
        events.write(json.dumps(dict(t=round(time.time() - t0, 3), peer=a.peer_index, **kw)) + "\n")

    signal.signal(signal.SIGTERM, on_sigterm)
    torch.set_num_threads(1)
    peer = shared_peer()
    x, y = peer.load("train"); xt, yt = peer.load("t10k")
    torch.manual_seed(0)  # identical initial weights on every peer, as in the shared peer
    model = peer.net() if a.model == "resnet" else torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 10))
    T, B = a.target_batch_size, a.batch
    total_epochs = max(1, a.max_samples // T)
    lr_scale = T / 128

    maddr = f"/ip4/{a.host}/tcp/{a.port}"
    dht = opt = None
    stats = dict(max_step_s=0.0, stalls=0, max_epoch_gap_s=0.0, local_samples=0, evals=0, best_acc=0.0,
                 eval_total_s=0.0)
    status = "ok"
    try:
        dht = hivemind.DHT(start=True, initial_peers=initial_peers(a.initial_peers),
                           host_maddrs=[maddr], announce_maddrs=[maddr])
        if a.maddr_out:  # write-then-rename so a reader never sees half a file
            tmp = a.maddr_out + ".tmp"
            with open(tmp, "w") as f:
                f.write("\n".join(str(m) for m in dht.get_visible_maddrs()) + "\n")
            os.replace(tmp, a.maddr_out)
        # BatchNorm running statistics are buffers, not parameters: hand them to Hivemind as extra_tensors so they
        # are averaged with the state and sent to peers that load state (its docs suggest exactly this). The
        # int64 num_batches_tracked counters are left out (unused: BatchNorm has a momentum).
        bn_stats = [b for n, b in model.named_buffers() if b.is_floating_point()]
        # Arguments: the synchronous configuration (use_local_updates=False, no delayed step or grad averaging),
        # equivalent to large-batch SGD with batch T, which is what cohort's swarm and DDP compute. Everything
        # else stays at Hivemind's defaults, which is what a user would get: offload_optimizer (True when params
        # are given), delay_state_averaging=True, average_state_every=1 (parameters are also averaged in the
        # background every epoch), no compression unless --compression fp16.
        opt = hivemind.Optimizer(
            dht=dht, run_id=a.run_id, params=model.parameters(),
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05 * lr_scale, momentum=0.9, nesterov=True,
                                                 weight_decay=5e-4),
            scheduler=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1 * lr_scale,
                                                                    total_steps=total_epochs),
            target_batch_size=T, batch_size_per_step=B,
            matchmaking_time=a.matchmaking_time, averaging_timeout=a.averaging_timeout,
            load_state_timeout=a.load_state_timeout, extra_tensors=bn_stats,
            use_local_updates=False, delay_optimizer_step=False, delay_grad_averaging=False, verbose=False,
            averager_opts=dict(target_group_size=a.target_group_size) if a.target_group_size else None,
            **compression(a.compression))
        if a.start_peers > 1:
            # Each peer signs in under one DHT key (a subkey each); training starts when all have. The progress
            # tracker cannot say it: a peer appears there only once it reports progress, after its first step.
            from hivemind.utils import get_dht_time
            key, seen, deadline = f"{a.run_id}_started", 0, time.time() + a.load_state_timeout
            while seen < a.start_peers:
                if time.time() > deadline:
                    raise RuntimeError(f"{seen} of {a.start_peers} peers seen within {a.load_state_timeout} s")
                dht.store(key, subkey=a.peer_index, value=1, expiration_time=get_dht_time() + 600)
                found = dht.get(key, latest=True)
                seen = len(found.value) if found is not None and isinstance(found.value, dict) else 0
                time.sleep(0.5)
            emit(started=True, peers=seen)

        # This peer's sample order: the whole training set, its own seed per pass (pass * npeers + index, so no
        # two peers or passes share a permutation), consumed B samples at a time.
        g = torch.Generator(); npass = 0; perm = torch.empty(0, dtype=torch.long); pos = 0
        last_epoch, last_epoch_t, last_eval = 0, time.time(), 0
        model.train()
        while opt.local_epoch < total_epochs:
            if pos + B > len(perm):
                g.manual_seed(a.seed + npass * a.npeers + a.peer_index); npass += 1
                perm = torch.randperm(len(x), generator=g); pos = 0
            idx = perm[pos:pos + B]; pos += B
            xb, yb = x[idx], y[idx]
            flip = torch.rand(len(xb), generator=g) < 0.5
            xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
            loss = F.cross_entropy(model(xb), yb, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            ts = time.time()
            opt.step()  # accumulates; at an epoch boundary: all-reduce, optimizer + scheduler step
            step_s = time.time() - ts
            stats["local_samples"] += B
            stats["max_step_s"] = max(stats["max_step_s"], step_s)
            if step_s > a.stall_s:
                stats["stalls"] += 1
                emit(epoch=opt.local_epoch, stall_s=round(step_s, 3))
            ep = opt.local_epoch
            if ep != last_epoch:  # epoch may jump by more than one when this peer loads state from others
                now = time.time()
                if a.epoch_events:
                    emit(epoch=ep)
                stats["max_epoch_gap_s"] = max(stats["max_epoch_gap_s"], now - last_epoch_t)
                last_epoch, last_epoch_t = ep, now
                if a.eval_every_steps and (ep // a.eval_every_steps > last_eval // a.eval_every_steps
                                           or ep >= total_epochs):
                    last_eval = ep
                    te = time.time()  # "t" is when this model existed; eval_s tells what the eval cost
                    model.eval(); correct = 0
                    with torch.no_grad():
                        for i in range(0, len(xt), 1000):
                            correct += (model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
                    model.train()
                    acc, eval_s = correct / len(xt), time.time() - te
                    # t_train leaves out the time spent in earlier evals, which the swarm also waited for
                    t_train = te - t0 - stats["eval_total_s"]
                    events.write(json.dumps(dict(t=round(te - t0, 3), t_train=round(t_train, 3),
                                                 peer=a.peer_index, epoch=ep, samples=ep * T, test_acc=acc,
                                                 eval_s=round(eval_s, 3))) + "\n")
                    stats["evals"] += 1; stats["best_acc"] = max(stats["best_acc"], acc)
                    stats["eval_total_s"] = round(stats["eval_total_s"] + eval_s, 3)
                    last_epoch_t = time.time()  # an eval is not a stall of the swarm's epochs
    except Terminated:
        status = "sigterm"
    except BaseException as e:  # KeyboardInterrupt, hivemind errors: still report, then re-raise
        status = f"error: {e!r}"
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the report short
        epoch = opt.local_epoch if opt is not None else 0
        # The sum of the weights: peers that averaged every step end with the same one.
        weights_sum = float(sum(p.detach().double().sum() for p in model.parameters()))
        emit(done=True, status=status, wall_s=round(time.time() - t0, 3), epoch=epoch, samples=epoch * T,
             weights_sum=weights_sum,
             total_epochs=total_epochs, npeers=a.npeers, batch=B, target_batch_size=T,
             max_step_s=round(stats.pop("max_step_s"), 3), max_epoch_gap_s=round(stats.pop("max_epoch_gap_s"), 3),
             hivemind=hivemind.__version__, torch=torch.__version__, **stats)
        if events is not sys.stdout:
            events.close()
        # Shutdown can hang when the other peers are gone; the report is already written, so bound it.
        watchdog = threading.Timer(30, lambda: (kill_children(), os._exit(0 if status == "ok" else 1)))
        watchdog.daemon = True; watchdog.start()
        if opt is not None:
            opt.shutdown()
        if dht is not None:
            dht.shutdown()
        watchdog.cancel()
    sys.exit(0 if status in ("ok", "sigterm") else 1)


if __name__ == "__main__":
    main()
