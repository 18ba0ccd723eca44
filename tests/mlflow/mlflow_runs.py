#!/usr/bin/env python3
"""cohort's MLflow runs read back by MLflow itself: a real `mlflow server` (the reference environment's
mlflow) on loopback, two workers training with log.mlflow, then MLflow's own Python client finds every
param of config.json, every scalar of metrics.jsonl at its step, the tags, the artifacts and the status.
A run stopped by Slurm's preemption signal ends KILLED. Two swarm peers are two runs, tagged with one swarm
name, each with its own metrics. Then a server killed mid-run: the run still ends with exit status 0, warns naming the server, counts the
records it dropped in summary.json, and trains exactly as a run without MLflow.

  mlflow_runs.py COHORT WORKDIR
"""
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from mlflow.tracking import MlflowClient

SMALL = ["data.train_limit=1024", "data.test_limit=256", "data.batch_size=64", "log.every_steps=2"]

# metrics.jsonl field -> the scalar's name (TensorBoard's tag, MLflow's metric key), per record kind.
KEYS = {
    "train": {"loss": "train/loss", "top1": "train/top1", "top5": "train/top5", "lr": "train/lr",
              "images_per_second": "train/images_per_second", "sync_bytes": "train/sync_bytes",
              "achieved_tflops": "train/achieved_tflops", "mfu": "train/mfu"},
    "eval": {"test_loss": "val/loss", "test_top1": "val/top1", "test_top5": "val/top5"},
}


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def expected(run_dir):
    """{key: {step: value}} from metrics.jsonl."""
    want = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            for field, key in KEYS.get(r["kind"], {}).items():
                if r.get(field) is not None:
                    want.setdefault(key, {})[r["step"]] = float(r[field])
            if r["kind"] == "resources":
                for rank, cpu in enumerate(r["cpu_percent"]):
                    want.setdefault(f"cpu/percent/rank{rank}", {})[r["step"]] = float(cpu)
    return want


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work):
    """A real `mlflow server` with a SQLite store and its artifact proxy, in WORK; returns (process, url)."""
    os.makedirs(work, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{work}/mlflow.db", "--artifacts-destination", f"{work}/artifacts"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while True:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=5).read().strip() == b"OK":
                return server, url
        except OSError:
            pass
        if server.poll() is not None or time.time() > deadline:
            fail(f"mlflow server did not start: {open(os.path.join(work, 'server.log')).read()[-2000:]}")
        time.sleep(0.5)


def stop_server(server):
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def train(cohort, run_dir, *args, timeout=900):
    shutil.rmtree(run_dir, ignore_errors=True)
    return subprocess.Popen([cohort, "train", "--nproc-per-node", "2", "--run-dir", run_dir, *SMALL, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(p, what, timeout=900):
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        fail(f"{what}: cohort train exited {p.returncode}: {err[-3000:]}")
    return out, err


def round_trip(cohort, work):
    server, url = start_server(os.path.join(work, "server"))
    try:
        run_dir = os.path.join(work, "run")
        finished(train(cohort, run_dir, "train.epochs=2", f"log.mlflow={url}", "log.mlflow_experiment=roundtrip"),
                 "round trip")
        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("roundtrip")
        runs = client.search_runs([experiment.experiment_id])
        if len(runs) != 1:
            fail(f"expected one run in experiment 'roundtrip', found {len(runs)}")
        run = runs[0]
        if run.info.run_name != "run" or run.info.status != "FINISHED":
            fail(f"run name {run.info.run_name!r} status {run.info.status}, expected 'run' FINISHED")
        config = json.load(open(os.path.join(run_dir, "config.json")))
        params = run.data.params
        for key, value in config.items():
            text = value if isinstance(value, str) else json.dumps(value)
            if params.get(key) != text:
                fail(f"param {key}: MLflow has {params.get(key)!r}, config.json {text!r}")
        if len(params) != len(config):
            fail(f"MLflow has {len(params)} params, config.json {len(config)} keys")
        tags = run.data.tags
        for key, value in {"cohort.world_size": "2", "cohort.strategy": "ddp", "cohort.launcher": "cohort"}.items():
            if tags.get(key) != value:
                fail(f"tag {key}: {tags.get(key)!r}, expected {value!r}")
        if not tags.get("cohort.version") or not tags.get("cohort.precision"):
            fail(f"tags lack cohort.version or cohort.precision: {tags}")
        want = expected(run_dir)
        scalars = 0
        for key, steps in want.items():
            got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            if sorted(got) != sorted(steps):
                fail(f"metric {key} at steps {sorted(got)}, metrics.jsonl has {sorted(steps)}")
            for step, v in steps.items():
                if not math.isclose(got[step], v, rel_tol=1e-12, abs_tol=1e-300):
                    fail(f"metric {key} step {step}: MLflow {got[step]!r}, metrics.jsonl {v!r}")
            scalars += len(steps)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        artifacts |= {a.path for d in ("report", "checkpoints") for a in client.list_artifacts(run.info.run_id, d)}
        for a in ("summary.json", "config.json", "metrics.jsonl", "report/report.md", "checkpoints/best.safetensors"):
            if a not in artifacts:
                fail(f"artifact {a} missing; the run has {sorted(artifacts)}")
        local = client.download_artifacts(run.info.run_id, "checkpoints/best.safetensors", work)
        if open(local, "rb").read() != open(os.path.join(run_dir, "checkpoints", "best.safetensors"), "rb").read():
            fail("the best checkpoint read back from MLflow differs from the run's")
        summary = json.load(open(os.path.join(run_dir, "summary.json")))["mlflow"]
        if summary["dropped"] != 0 or summary["run_id"] != run.info.run_id or summary["sent"] < scalars + len(config):
            fail(f"summary.json's mlflow section {summary}: expected 0 dropped, run {run.info.run_id}, "
                 f"at least {scalars + len(config)} sent")
        print(f"round trip: {len(config)} params, {len(want)} metrics with {scalars} values at their steps, "
              f"{len(artifacts)} artifacts (best checkpoint byte-equal), status FINISHED; summary.json: {summary}")
        return url, server
    except BaseException:
        stop_server(server)
        raise


def swarm_peers(cohort, work, url):
    """Two swarm peers logging to one server: each is an MLflow run of its own, the first named by
    log.mlflow_run_name (a machine-local key: the peers' configs still agree), the second by its run dir;
    both carry one cohort.swarm tag, and each holds its own metrics.jsonl at their steps."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    peers, dirs = [], []
    for i in range(2):
        dirs.append(os.path.join(work, f"swarm-peer{i}"))
        shutil.rmtree(dirs[-1], ignore_errors=True)
        args = [cohort, "train", "--nproc-per-node", "1", "--run-dir", dirs[-1], *SMALL, "train.max_steps=8",
                "train.threads=1", "dist.strategy=swarm", "swarm.insecure=true", f"swarm.listen=127.0.0.{2 + i}:{port}",
                "swarm.min_peers_to_start=2", "swarm.min_group_size=2", "swarm.matchmaking_s=30",
                f"log.mlflow={url}", "log.mlflow_experiment=swarm"]
        if i == 0:
            args.append("log.mlflow_run_name=first peer")
        else:
            args.append(f"swarm.initial_peers=127.0.0.2:{port}")
        peers.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for i, p in enumerate(peers):
        finished(p, f"swarm peer {i}")
    client = MlflowClient(tracking_uri=url)
    runs = client.search_runs([client.get_experiment_by_name("swarm").experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    if sorted(by_name) != ["first peer", "swarm-peer1"]:
        fail(f"expected runs 'first peer' and 'swarm-peer1' in experiment 'swarm', found {sorted(by_name)}")
    swarms = {r.data.tags.get("cohort.swarm") for r in runs}
    if len(swarms) != 1 or not next(iter(swarms), "") or not next(iter(swarms)).startswith("swarm-"):
        fail(f"the peers' cohort.swarm tags are {swarms}, expected one 'swarm-<hash>' for both")
    values = 0
    for run, run_dir in zip([by_name["first peer"], by_name["swarm-peer1"]], dirs):
        if run.info.status != "FINISHED" or run.data.tags.get("cohort.strategy") != "swarm":
            fail(f"run {run.info.run_name}: status {run.info.status}, strategy tag "
                 f"{run.data.tags.get('cohort.strategy')!r}")
        if run.data.tags.get("cohort.run_dir") != os.path.abspath(run_dir):
            fail(f"run {run.info.run_name}: cohort.run_dir {run.data.tags.get('cohort.run_dir')!r}, expected {run_dir}")
        for key, steps in expected(run_dir).items():
            got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            if sorted(got) != sorted(steps) or any(not math.isclose(got[k], v, rel_tol=1e-12) for k, v in steps.items()):
                fail(f"run {run.info.run_name} metric {key}: MLflow {got}, its metrics.jsonl {steps}")
            values += len(steps)
    losses = [by_name[n].data.metrics.get("train/loss") for n in ("first peer", "swarm-peer1")]
    print(f"swarm: 2 peers, 2 MLflow runs ('first peer', 'swarm-peer1') tagged cohort.swarm={swarms.pop()}, "
          f"{values} metric values at their steps, each its own peer's (last train/loss {losses})")


def wait_for_metrics(client, experiment, p, deadline_s=300):
    """Until the experiment's run shows metrics on the server; the run's process must still be going."""
    deadline = time.time() + deadline_s
    while True:
        try:
            e = client.get_experiment_by_name(experiment)
            runs = client.search_runs([e.experiment_id]) if e else []
            if runs and runs[0].data.metrics:
                return runs[0]
        except Exception:
            pass
        if p.poll() is not None or time.time() > deadline:
            return None
        time.sleep(0.2)


def stopped_by_a_signal(cohort, work, url):
    """Slurm's preemption warning, SIGUSR1 to each worker as Slurm sends it to each task: the ranks agree on
    a stop step, save, say so in summary.json, and the MLflow run ends KILLED."""
    run_dir = os.path.join(work, "preempted")
    p = train(cohort, run_dir, "train.epochs=3", "data.train_limit=4096", "log.every_steps=1", f"log.mlflow={url}",
              "log.mlflow_experiment=preempted")
    client = MlflowClient(tracking_uri=url)
    run = wait_for_metrics(client, "preempted", p)
    if run is None:
        fail("the run never showed metrics on the server before it ended")
    workers = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    for w in workers:
        os.kill(int(w), signal.SIGUSR1)
    out, err = p.communicate(timeout=300)
    status = client.get_run(run.info.run_id).info.status
    summary_file = os.path.join(run_dir, "summary.json")
    stopped_by = json.load(open(summary_file)).get("stopped_by") if os.path.exists(summary_file) else "no summary.json"
    if status != "KILLED" or stopped_by != "SIGUSR1":
        fail(f"after SIGUSR1 to workers {workers}: MLflow status {status}, summary.json stopped_by {stopped_by!r} "
             f"(exit {p.returncode}): {err[-2000:]}")
    print(f"SIGUSR1 to both workers mid-run: exit {p.returncode}, summary.json stopped_by SIGUSR1, MLflow status KILLED")


def server_killed_mid_run(cohort, work):
    server, url = start_server(os.path.join(work, "server-killed"))
    longer = ["train.epochs=3", "data.train_limit=4096", "log.every_steps=1"]
    run_dir = os.path.join(work, "killed")
    p = train(cohort, run_dir, *longer, f"log.mlflow={url}", "log.mlflow_experiment=killed",
              "log.mlflow_buffer=8", "log.mlflow_timeout_s=2")
    if wait_for_metrics(MlflowClient(tracking_uri=url), "killed", p) is None:
        stop_server(server)
        fail("the run never showed metrics on the server before it ended")
    stop_server(server)  # the run is on the server and has metrics: now the server goes
    killed_at = time.time()
    out, err = finished(p, "server killed mid-run")
    after = time.time() - killed_at
    if url not in err or "warning" not in err:
        fail(f"no warning naming the server {url}: {err[-2000:]}")
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    if summary["mlflow"]["dropped"] <= 0:
        fail(f"summary.json counts no dropped records: {summary['mlflow']}")
    plain_dir = os.path.join(work, "plain")
    finished(train(cohort, plain_dir, *longer), "the same run without MLflow")
    losses = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, open(os.path.join(d, "metrics.jsonl")))
                        if r["kind"] == "train"]
    if losses(run_dir) != losses(plain_dir):
        fail("the run whose server was killed trained differently from the run without MLflow")
    top1 = json.load(open(os.path.join(plain_dir, "summary.json")))["test_accuracy"]
    if summary["test_accuracy"] != top1:
        fail(f"test accuracy {summary['test_accuracy']} against {top1} without MLflow")
    print(f"server killed mid-run: exit 0, {after:.1f} s after the kill, warned naming {url}, "
          f"{summary['mlflow']['dropped']} records dropped (summary.json), {summary['mlflow']['sent']} sent before; "
          f"losses at {len(losses(run_dir))} steps and test top-1 equal to a run without MLflow")


def main():
    cohort, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    url, server = round_trip(cohort, work)
    try:
        stopped_by_a_signal(cohort, work, url)
        swarm_peers(cohort, work, url)
    finally:
        stop_server(server)
    server_killed_mid_run(cohort, work)


if __name__ == "__main__":
    main()
