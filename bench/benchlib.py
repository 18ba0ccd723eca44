"""What every JSON benchmark here ends with: the result printed, and written to --out when given."""
import json


def emit(result, out=None):
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
