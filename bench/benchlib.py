"""What every JSON benchmark here shares: the machine it ran on, and the result printed, and written to --out
when given."""
import json
import os


def machine():
    """The CPU kind. Figures differ by kind: `auto` picks bf16 where oneDNN has AMX or AVX512-BF16 and its
    bf16 measures at least 1.25x its fp32 (train/AutoSettings.h), and the
    contiguous layout without AVX-512; the AVX2-only kind runs about 2.3 times slower."""
    model, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return {"cores": os.cpu_count(), "cpu": model,
            "vector_isa": [f for f in ("avx2", "avx512f") if f in flags],
            "bf16_isa": [f for f in ("amx_bf16", "avx512_bf16") if f in flags]}


def emit(result, out=None):
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
