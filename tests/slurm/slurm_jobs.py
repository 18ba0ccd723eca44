#!/usr/bin/env python3
"""cohort under a real Slurm (Debian's slurmctld, slurmd and munge), started by this test on this machine:
one controller and two slurmd nodes (n1, n2) on loopback, each slurmd on a port of its own.

1. `sbatch --wait examples/slurm/cohort.sbatch ...`: 2 nodes, 1 task each; summary.json says launcher
   slurm, world size 2, in runs/slurm-<job id> (no --run-dir).
2. The same job again, sent Slurm's preemption warning mid-run (`scancel --signal=USR1`, which reaches every
   task): the ranks stop after one agreed step, save, rank 0 requeues the job, and the requeued job
   (SLURM_RESTART_COUNT=1) resumes and finishes with the same losses as job 1 from the stop on.

Needs root (the daemons run as root here). Without root, or without the packages, it is a reported skip
(exit 77); `make test-slurm` installs the packages.

  slurm_jobs.py COHORT SOURCE_DIR WORKDIR
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from run_metrics import train_losses  # noqa: E402

SKIP = 77
STEPS = 40
QUICK = ["train.device=cpu", "model.name=resnet8", "model.width=4", "data.train_limit=1536",
         "data.test_limit=500", "data.batch_size=32", "log.every_steps=1", "dist.timeout_s=60",
         "amp.precision=fp32", "train.channels_last=false", "eval.enabled=false", f"train.max_steps={STEPS}",
         "ckpt.every_steps=100"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def skip(msg):
    print(f"SKIPPED: {msg}")
    sys.exit(SKIP)


class Cluster:
    """munged, slurmctld and two slurmd, with their files under `root`; stop() ends them all."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        base = 17000 + (os.getpid() % 1000) * 4
        self.ports = {"ctld": base, "n1": base + 1, "n2": base + 2}
        for d in ("munge", "state", "spool/n1", "spool/n2", "log"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self):
        munge = os.path.join(self.root, "munge")
        shutil.copy("/etc/munge/munge.key", os.path.join(munge, "key"))
        shutil.chown(munge, "munge", "munge")
        shutil.chown(os.path.join(munge, "key"), "munge", "munge")
        os.chmod(os.path.join(munge, "key"), 0o400)
        self.socket = os.path.join(munge, "socket")
        subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--key-file={munge}/key",
                        f"--socket={self.socket}", f"--pid-file={munge}/pid", f"--log-file={munge}/log",
                        f"--seed-file={munge}/seed"], check=True)
        self.write_conf()
        subprocess.run(["slurmctld", "-f", self.conf], check=True, env=self.env)
        for n in ("n1", "n2"):
            subprocess.run(["slurmd", "-N", n, "-f", self.conf], check=True, env=self.env)
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T %D"], capture_output=True, text=True, env=self.env).stdout
            if out.strip() == "idle 2":
                return
            time.sleep(0.5)
        fail(f"the two slurmd nodes did not come up idle in 60 s (sinfo: {out!r}); logs in {self.root}/log")

    def write_conf(self):
        r, host = self.root, os.uname().nodename
        lines = [
            "ClusterName=cohorttest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={self.ports['ctld']}",
            # cred_expire: how long a requeued job waits before it may run again (default 120 s). Lifting the
            # wait instead (scontrol update StartTime=now) lets it start while its old credential is still
            # revoked, and Slurm kills it ("Job credential revoked").
            "AuthType=auth/munge", f"AuthInfo=socket={self.socket},cred_expire=10", "CredType=cred/munge",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
            "JobRequeue=1", "KillWait=10",
        ]
        for n in ("n1", "n2"):
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.ports[n]} CPUs=2 "
                         "State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def stop(self):
        subprocess.run(["scancel", "--full", "--signal=KILL", "-u", "root"], capture_output=True, env=self.env)
        for pidfile in glob.glob(os.path.join(self.root, "*.pid")) + [os.path.join(self.root, "munge", "pid")]:
            try:
                os.kill(int(open(pidfile).read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass


def sbatch(cluster, cohort, source, workdir, extra_env, wait):
    os.makedirs(workdir, exist_ok=True)
    env = dict(cluster.env, MASTER_ADDR="127.0.0.1", COHORT=cohort, **extra_env)
    argv = ["sbatch", "--parsable", f"--chdir={workdir}"] + (["--wait"] if wait else []) + \
        [os.path.join(source, "examples", "slurm", "cohort.sbatch")] + QUICK
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    job = r.stdout.strip().split(";")[0].splitlines()[0] if r.stdout.strip() else ""
    if not job.isdigit():
        fail(f"sbatch printed no job id (exit {r.returncode}): {r.stdout}{r.stderr}")
    if wait and r.returncode != 0:
        fail(f"job {job} failed (sbatch --wait exit {r.returncode}):\n{log_of(workdir, job)}")
    return job


def log_of(workdir, job):
    try:
        return open(os.path.join(workdir, f"cohort-{job}.out")).read()[-4000:]
    except OSError:
        return "(no output file)"


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def job_state(cluster, job):
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=cluster.env).stdout
    state = re.search(r"JobState=(\S+)", out)
    restarts = re.search(r"Restarts=(\d+)", out)
    return (state.group(1) if state else "?"), (int(restarts.group(1)) if restarts else -1)


def plain_job(cluster, cohort, source, work):
    d = os.path.join(work, "plain")
    job = sbatch(cluster, cohort, source, d, {}, wait=True)
    run_dir = os.path.join(d, "runs", f"slurm-{job}")
    s = summary(run_dir)
    for key, want in (("launcher", "slurm"), ("world_size", 2), ("steps", STEPS), ("restarts", 0)):
        if s.get(key) != want:
            fail(f"job {job}: summary.json has {key} = {s.get(key)!r}, expected {want!r}")
    print(f"job {job}: 2 nodes, launcher slurm, {STEPS} steps in runs/slurm-{job}")
    return train_losses(run_dir)


def preempted_job(cluster, cohort, source, work, reference):
    d = os.path.join(work, "preempted")
    # A slower step, so that the warning lands mid-run whatever the machine's speed.
    job = sbatch(cluster, cohort, source, d, {"COHORT_FAULT_STEP_DELAY_MS": "150"}, wait=False)
    run_dir = os.path.join(d, "runs", f"slurm-{job}")
    deadline = time.time() + 300
    while time.time() < deadline and len(train_losses(run_dir) if os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
                                         else {}) < 5:
        time.sleep(0.3)
    subprocess.run(["scancel", "--signal=USR1", job], check=True, env=cluster.env)
    ended_since = None
    while time.time() < deadline:
        state, restarts = job_state(cluster, job)
        if state == "COMPLETED" and restarts >= 1:
            break
        # While Slurm requeues a running job, the job can show FAILED for a moment (its killed tasks): an end
        # other than COMPLETED counts only once it has held for 10 s.
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and restarts >= 1:
            ended_since = ended_since or time.time()
            if time.time() - ended_since > 10:
                break
        else:
            ended_since = None
        time.sleep(0.5)
    else:
        fail(f"job {job} did not finish its requeued run within 300 s (state {job_state(cluster, job)}):\n"
             f"{log_of(d, job)}")
    log = log_of(d, job)
    if state != "COMPLETED":
        fail(f"job {job} ended {state} after its requeue:\n{log}")
    stop = re.search(r"SIGUSR1: leaving after step (\d+)", log)
    if not stop or "asked Slurm to requeue job " + job not in log or "restart 1: resuming from" not in log:
        fail(f"job {job}: expected a SIGUSR1 stop, a requeue and a resume in its output:\n{log}")
    s = summary(run_dir)
    if s.get("restarts") != 1 or s.get("steps") != STEPS:
        fail(f"job {job}: summary.json has restarts {s.get('restarts')}, steps {s.get('steps')}")
    stop_step = int(stop.group(1))
    got = train_losses(run_dir)
    for step in range(stop_step + 1, STEPS + 1):
        if got.get(step) != reference.get(step):
            fail(f"job {job}: step {step}'s loss {got.get(step)} differs from the uninterrupted job's "
                 f"{reference.get(step)}")
    print(f"job {job}: SIGUSR1 mid-run, both ranks stopped after step {stop_step}, the job was requeued and "
          f"resumed; steps {stop_step + 1}-{STEPS} equal the uninterrupted job's losses")


def main():
    cohort, source, work = sys.argv[1:4]
    if os.geteuid() != 0:
        skip("not root: this test runs Slurm's daemons as root")
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not shutil.which(c)]
    if missing or not os.path.exists("/etc/munge/munge.key"):
        skip(f"Slurm is not installed (missing: {' '.join(missing) or '/etc/munge/munge.key'}): make test-slurm "
             "installs it")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cluster = Cluster(os.path.join(work, "cluster"))
    try:
        cluster.start()
        reference = plain_job(cluster, cohort, source, work)
        preempted_job(cluster, cohort, source, work, reference)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
