"""What the process-level Python tests read back from a cohort run directory (run by any python3)."""
import json
import os


def train_losses(run_dir):
    """{step: loss} of metrics.jsonl's train records; a step logged twice (a resumed run) keeps the last."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["kind"] == "train":
                out[r["step"]] = r["loss"]
    return out
