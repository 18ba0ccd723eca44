"""One Hivemind peer averaging one fp32 vector with the others, for bench/swarm_software.py (the averaging's
own cost, Hivemind against cohort's swarm, on loopback where no link limits either).

The vector is --numel fp32 values (a model's gradients), averaged with hivemind's DecentralizedAverager,
NoCompression, in groups of all --npeers peers, --rounds times. Each round's all-reduce is timed in the
averager's own process around `_aggregate_with_group` (the group's butterfly: parts sent, reduced, results
back, and the results loaded into the averaged tensor), which leaves out matchmaking, as cohort's
swarm_averaging_seconds does. One torch thread.

Usage (first peer writes its multiaddrs, the others read them):
  python3 hivemind_average.py --host 127.0.0.1 --maddr-out /tmp/m --npeers 2 --numel 11175370 --out t0.jsonl
  python3 hivemind_average.py --host 127.0.0.2 --initial-peers /tmp/m --npeers 2 --numel 11175370 --out t1.jsonl
--out gets one JSON line per round: {"seconds", "group_size"}.
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: hivemind's averager process inherits it
import argparse, json, sys, time

import torch
import hivemind
from hivemind.averaging import DecentralizedAverager

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hivemind_fmnist import initial_peers  # noqa: E402


class TimedAverager(DecentralizedAverager):
    """Appends each all-reduce's seconds to `timings_path`. The averager runs in a forked process, so the
    path is a class attribute set before it starts."""
    timings_path = None

    async def _aggregate_with_group(self, group_info, min_vector_size, **kwargs):
        t0 = time.perf_counter()
        out = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        with open(self.timings_path, "a") as f:
            f.write(json.dumps({"seconds": time.perf_counter() - t0, "group_size": len(group_info.peer_ids)}) + "\n")
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--maddr-out")
    ap.add_argument("--initial-peers", default="")
    ap.add_argument("--npeers", type=int, required=True)
    ap.add_argument("--numel", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--matchmaking-time", type=float, default=2.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    maddr = f"/ip4/{a.host}/tcp/{a.port}"
    dht = hivemind.DHT(start=True, initial_peers=initial_peers(a.initial_peers), host_maddrs=[maddr],
                       announce_maddrs=[maddr])
    if a.maddr_out:  # write-then-rename so a reader never sees half a file
        with open(a.maddr_out + ".tmp", "w") as f:
            f.write("\n".join(str(m) for m in dht.get_visible_maddrs()))
        os.replace(a.maddr_out + ".tmp", a.maddr_out)
    TimedAverager.timings_path = a.out
    averager = TimedAverager([torch.randn(a.numel)], dht, start=True, prefix="cohort-bench-average",
                             target_group_size=a.npeers, min_group_size=a.npeers,
                             min_matchmaking_time=a.matchmaking_time, request_timeout=10, allreduce_timeout=600,
                             allow_state_sharing=False)
    done = 0
    deadline = time.time() + 600
    while done < a.rounds and time.time() < deadline:
        if averager.step(timeout=300, allow_retries=True) is not None:
            done += 1
    averager.shutdown()
    dht.shutdown()
    if done < a.rounds:
        sys.exit(f"hivemind peer {a.host}: {done} of {a.rounds} rounds averaged")


if __name__ == "__main__":
    main()
