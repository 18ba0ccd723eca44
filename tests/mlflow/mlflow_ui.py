#!/usr/bin/env python3
"""A cohort run's page in MLflow's own UI, loaded by headless Chromium (Debian's `chromium`): the page a
user opens shows the run's metrics. The rendered page (its Overview tab) must name the run, say it
finished, and list every metric of the run with its count, and its screenshot stays in
WORKDIR/run_page.png. (The "Model metrics" tab draws its charts only as they scroll into view, which a
headless screenshot does not wait for; the Overview's table holds each metric's last value.)

  mlflow_ui.py COHORT WORKDIR
"""
import os
import re
import shutil
import subprocess
import sys

from mlflow.tracking import MlflowClient

from mlflow_runs import fail, finished, start_server, stop_server, train


def chromium(*args):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        print("skipped: Debian's chromium is not installed (make test-mlflow installs it)", file=sys.stderr)
        sys.exit(77)
    # As root Chromium needs --no-sandbox; the virtual time budget lets the page's scripts fetch and draw
    # the run before the page is read.
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1600,1700", "--virtual-time-budget=30000", *args],
                          capture_output=True, text=True, timeout=300)


def main():
    cohort, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    server, url = start_server(os.path.join(work, "server"))
    try:
        run_dir = os.path.join(work, "ui-run")
        finished(train(cohort, run_dir, "train.epochs=2", f"log.mlflow={url}", "log.mlflow_experiment=ui"), "ui run")
        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("ui")
        run = client.search_runs([experiment.experiment_id])[0]
        page = f"{url}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
        dom = chromium("--dump-dom", page)
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom.stdout))
        want = ["ui-run", "Finished", f"Metrics ({len(run.data.metrics)})"] + sorted(run.data.metrics)
        missing = [w for w in want if w not in text]
        if missing:
            fail(f"the run page {page} rendered without {missing} (chromium exit {dom.returncode}): "
                 f"{dom.stderr[-1500:]}")
        shot = os.path.join(work, "run_page.png")
        chromium(f"--screenshot={shot}", page)
        if not os.path.exists(shot) or os.path.getsize(shot) < 10000:
            fail(f"no screenshot of {page} at {shot}")
        print(f"MLflow UI: the run page names {want}; screenshot {shot} ({os.path.getsize(shot)} bytes)")
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
