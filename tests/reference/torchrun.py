#!/usr/bin/env python3
"""cohort's workers under the real torchrun of the reference environment (torch 2.14), for each cohort
binary given (Debian's build against LibTorch 1.13, and pip's against 2.14 where it is built):

1. `torchrun --standalone --nproc-per-node 2 --no-python COHORT train ...`: trains, world size 2,
   launcher torchrun, in runs/torchrun-<TORCHELASTIC_RUN_ID> (no --run-dir given).
2. `--rdzv-backend c10d --rdzv-endpoint` across two machines made of network namespaces (root only; a
   reported skip of this case otherwise).
3. `--max-restarts 1` with worker 1 killed (SIGKILL) after step 8: the restarted workers resume from the
   step-8 checkpoint in the derived run dir, and their losses for steps 9-12 equal case 1's.

Every torchrun is bounded: one that outlives its limit is killed and the test fails naming it (the bug
this test was written for was a silent hang: cohort built against 1.13 spoke the wrong store protocol).

  torchrun.py WORKDIR COHORT [COHORT...]
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from run_metrics import train_losses  # noqa: E402

# The torchrun of the python running this script (the reference environment's), else the one on PATH.
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
if not os.access(TORCHRUN, os.X_OK):
    TORCHRUN = shutil.which("torchrun") or TORCHRUN
STEPS = 12
# As the process tests' quick_args: fp32, the contiguous layout and the CPU (a GPU's kernels need not
# repeat bit for bit from run to run), so losses compare bit for bit.
QUICK = ["train.device=cpu", "model.name=resnet8", "model.width=4", "data.train_limit=1536", "data.test_limit=500",
         "data.batch_size=32", "log.every_steps=1", "dist.timeout_s=60", "amp.precision=fp32",
         "train.channels_last=false", f"train.max_steps={STEPS}", "eval.enabled=false", "ckpt.every_steps=4"]
LIMIT_S = 300


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def run(what, argv, cwd, env_extra=None, limit=LIMIT_S):
    """Starts argv in its own process group; returns (exit code, output). Kills the group past `limit`."""
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        fail(f"{what}: still running after {limit} s, killed (a hang):\n{out[-4000:]}")
    return p.returncode, out


def only_run_dir(cwd):
    dirs = glob.glob(os.path.join(cwd, "runs", "torchrun-*"))
    if len(dirs) != 1:
        fail(f"expected one runs/torchrun-<id> directory in {cwd}, found {dirs}")
    return dirs[0]


def check_summary(what, run_dir, restarts=0):
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    for key, want in (("world_size", 2), ("launcher", "torchrun"), ("steps", STEPS), ("restarts", restarts)):
        if s.get(key) != want:
            fail(f"{what}: summary.json has {key} = {s.get(key)!r}, expected {want!r}")
    return s


def standalone(cohort, work):
    cwd = os.path.join(work, "standalone")
    os.makedirs(cwd)
    rc, out = run("torchrun --standalone", [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python",
                                            cohort, "train", *QUICK], cwd)
    if rc != 0:
        fail(f"torchrun --standalone exited {rc}:\n{out[-4000:]}")
    run_dir = only_run_dir(cwd)
    check_summary("standalone", run_dir)
    print(f"standalone: 2 workers, {STEPS} steps in {os.path.relpath(run_dir, cwd)}")
    return train_losses(run_dir)


def restart(cohort, work, reference):
    cwd = os.path.join(work, "restart")
    os.makedirs(cwd)
    rc, out = run("torchrun --max-restarts 1",
                  [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval",
                   "0.5", "--no-python", cohort, "train", *QUICK], cwd,
                  {"COHORT_FAULT_STEP": "8", "COHORT_FAULT_RANK": "1"})
    if rc != 0:
        fail(f"torchrun --max-restarts 1 exited {rc}:\n{out[-4000:]}")
    if "restart 1: resuming from" not in out:
        fail(f"the restarted workers did not resume from a checkpoint:\n{out[-4000:]}")
    run_dir = only_run_dir(cwd)
    check_summary("restart", run_dir, restarts=1)
    got = train_losses(run_dir)
    for step in range(9, STEPS + 1):
        if got.get(step) != reference.get(step):
            fail(f"restart: step {step}'s loss {got.get(step)} differs from the uninterrupted run's "
                 f"{reference.get(step)}")
    print(f"restart: worker 1 killed after step 8, resumed, steps 9-{STEPS} equal the uninterrupted run's losses")


class TwoMachines:
    """Two network namespaces joined by a veth pair: 10.78.0.1 and 10.78.0.2."""

    def __init__(self):
        self.names = [f"trn{os.getpid() % 100000}m{i}" for i in range(2)]
        self.why_not = None
        if os.geteuid() != 0:
            self.why_not = "not root"
            return
        if not shutil.which("ip"):
            self.why_not = "no `ip` command (iproute2)"
            return
        veth = f"trv{os.getpid() % 100000}"
        cmds = [f"ip netns add {self.names[0]}", f"ip netns add {self.names[1]}",
                f"ip link add {veth}a type veth peer name {veth}b",
                f"ip link set {veth}a netns {self.names[0]}", f"ip link set {veth}b netns {self.names[1]}"]
        for i, (n, dev) in enumerate(zip(self.names, (f"{veth}a", f"{veth}b"))):
            cmds += [f"ip -n {n} addr add {self.address(i)}/24 dev {dev}", f"ip -n {n} link set {dev} up",
                     f"ip -n {n} link set lo up"]
        for c in cmds:
            try:
                failed = subprocess.run(c.split(), capture_output=True).returncode != 0
            except OSError as e:  # an `ip` on PATH that cannot run
                failed = e
            if failed:
                self.why_not = f"`{c}` failed" + (f" ({failed})" if isinstance(failed, OSError) else "")
                return

    @staticmethod
    def address(i):
        return f"10.78.0.{i + 1}"

    def close(self):
        if self.why_not in ("not root", "no `ip` command (iproute2)"):
            return
        for n in self.names:
            try:
                subprocess.run(["ip", "netns", "del", n], capture_output=True)
            except OSError:
                pass


def across_machines(cohort, work):
    machines = TwoMachines()
    try:
        if machines.why_not:
            print(f"c10d rendezvous across machines: SKIPPED ({machines.why_not})")
            return
        cwd = os.path.join(work, "nodes")
        procs = []
        for i, ns in enumerate(machines.names):
            node = os.path.join(cwd, f"node{i}")
            os.makedirs(node)
            argv = ["ip", "netns", "exec", ns, TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{machines.address(0)}:29411",
                    "--rdzv-id", "nodes", "--local-addr", machines.address(i),
                    # torchrun finds the store's host by its host name, which names neither namespace.
                    "--rdzv-conf", f"is_host={int(i == 0)}", "--no-python", cohort, "train",
                    *QUICK]
            procs.append((node, subprocess.Popen(argv, cwd=node, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 text=True, start_new_session=True)))
        outs = []
        for node, p in procs:
            try:
                out, _ = p.communicate(timeout=LIMIT_S)
            except subprocess.TimeoutExpired:
                for _, q in procs:
                    os.killpg(q.pid, signal.SIGKILL)
                fail(f"torchrun on {node} still running after {LIMIT_S} s, killed (a hang)")
            if p.returncode != 0:
                fail(f"torchrun on {node} exited {p.returncode}:\n{out[-4000:]}")
            outs.append(out)
        # Rank 0 writes the summary on whichever machine the rendezvous made rank 0.
        summaries = glob.glob(os.path.join(cwd, "node*", "runs", "torchrun-nodes", "summary.json"))
        if len(summaries) != 1:
            fail(f"expected one summary.json among the two machines' runs/torchrun-nodes, found {summaries}")
        check_summary("across machines", os.path.dirname(summaries[0]))
        print(f"c10d rendezvous across machines {machines.address(0)} and {machines.address(1)}: world size 2")
    finally:
        machines.close()


def main():
    work, cohorts = sys.argv[1], sys.argv[2:]
    if not os.access(TORCHRUN, os.X_OK):
        fail(f"no torchrun beside {sys.executable}")
    for cohort in dict.fromkeys(os.path.realpath(c) for c in cohorts):
        if not os.access(cohort, os.X_OK):
            print(f"{cohort}: not built here, SKIPPED (make check-cuda builds pip's)")
            continue
        print(f"== {cohort}")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        reference = standalone(cohort, work)
        restart(cohort, work, reference)
        across_machines(cohort, work)


if __name__ == "__main__":
    main()
