#!/usr/bin/env python3
"""Runs cohort's input-pipeline bench (a built `input_pipeline` binary; this script builds nothing) and its
torchvision peer (bench/peer_torchvision_pipeline.py, PIL + the torchvision of --python) on the same folder of
generated ImageNet-sized JPEGs, in alternating rounds, and writes bench/results/input_pipeline.json with
the images/s of both for 1 and 2 workers (threads for cohort, processes for torchvision: one core each)
and the per-core ratio cohort / torchvision. The figures are medians over all timed passes.
Usage: input_pipeline.py --bench build/bench/input_pipeline [--images 256] [--repeats 3] [--rounds 3]
                         [--out bench/results/input_pipeline.json]"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path to the built input_pipeline binary")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="cohort, torchvision, cohort, ... rounds")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "input_pipeline.json"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the peer's Python: Debian's has torchvision 0.14, the reference environment 0.29")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="cohort_input_pipeline_")
    load_before = os.getloadavg()
    runs = {"cohort": {"threads_1": [], "threads_2": []}, "torchvision": {"workers_1": [], "workers_2": []}}
    try:
        mean_bytes = None
        for r in range(a.rounds):
            where = ["--keep", tmp, "--images", str(a.images)] if r == 0 else ["--dir", tmp]
            c = run_json([a.bench, "--repeats", str(a.repeats)] + where)
            mean_bytes = c["mean_file_bytes"]
            for k in runs["cohort"]:
                runs["cohort"][k] += c["runs"][k]
            t = run_json([a.python, os.path.join(HERE, "peer_torchvision_pipeline.py"), "--dir", tmp,
                          "--repeats", str(a.repeats)])
            versions = t["versions"]
            for k in runs["torchvision"]:
                runs["torchvision"][k] += t["runs"][k]
            print(f"round {r + 1}: cohort {c['cohort']}, torchvision {t['torchvision']}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {side: {k: round(statistics.median(v), 1) for k, v in d.items()} for side, d in runs.items()}
    ratio = {f"{n}_worker{'s' if n > 1 else ''}": round(med["cohort"][f"threads_{n}"] /
                                                        med["torchvision"][f"workers_{n}"], 2) for n in (1, 2)}
    result = {
        "bench": "input_pipeline",
        "work": "read file + decode + RandomResizedCrop(224) + horizontal flip + normalize to float CHW",
        "images": a.images, "rounds": a.rounds, "repeats": a.repeats, "mean_file_bytes": mean_bytes,
        "image_size": "about 500x375, quality 90, 4:2:0",
        "images_per_s": med, "ratio_cohort_over_torchvision_per_core": ratio, "goal": ">= 2x per core",
        "runs": runs, "torchvision_versions": versions,
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                 "load_after": [round(x, 2) for x in os.getloadavg()]},
        "note": "one worker = one core on both sides; medians over rounds x repeats passes; the host is shared, "
                "so single passes vary by 10-20%",
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps({"images_per_s": med, "ratio_per_core": ratio}))


if __name__ == "__main__":
    main()
