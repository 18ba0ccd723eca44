#!/usr/bin/env python3
"""The torchvision side of the interop tests (tests/unit/models/test_interop.cpp).

  export NAME OUT            torchvision NAME (num_classes=10) with random weights and random batch-norm
                             statistics -> OUT.safetensors; a fixed input -> OUT.input.safetensors; its
                             eval-mode logits -> OUT.logits.safetensors
  logits NAME WEIGHTS INPUT OUT
                             loads WEIGHTS (written by cohort) into torchvision NAME strictly, runs INPUT,
                             writes the logits to OUT

The safetensors reader and writer below are our own few lines: Debian has no python3-safetensors.
"""
import json
import struct
import sys

import torch
import torchvision

DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.float64: "F64"}
BACK = {v: k for k, v in DTYPES.items()}


def save(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = BACK[info["dtype"]]
        t = torch.frombuffer(bytearray(body[a:b]), dtype=dtype) if b > a else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def model(name):
    return getattr(torchvision.models, name)(num_classes=10).eval()


def main():
    torch.manual_seed(0)
    if sys.argv[1] == "export":
        name, out = sys.argv[2], sys.argv[3]
        net = model(name)
        with torch.no_grad():
            for mod in net.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.uniform_(-0.2, 0.2)
                    mod.running_var.uniform_(0.5, 1.5)
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.2, 0.2)
        x = torch.randn(2, 3, 224, 224)
        save(out + ".safetensors", net.state_dict())
        save(out + ".input.safetensors", {"x": x})
        with torch.no_grad():
            save(out + ".logits.safetensors", {"logits": net(x)})
    elif sys.argv[1] == "logits":
        name, weights, inp, out = sys.argv[2:6]
        net = model(name)
        net.load_state_dict(load(weights), strict=True)
        with torch.no_grad():
            save(out, {"logits": net(load(inp)["x"])})
    else:
        sys.exit("usage: see the docstring")


if __name__ == "__main__":
    main()
