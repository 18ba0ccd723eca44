#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<harness>/: small valid inputs for every parser, so libFuzzer
starts from files that get past the first checks instead of guessing magic numbers.

Standard library only, and deterministic (gzip timestamps are zero), so running it again rewrites the
checked-in files byte for byte. The shipped configs/*.toml are copied in as config seeds.

    python3 fuzz/make_corpus.py
"""
import gzip
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: the seeds are a few hundred bytes."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value in FACTS.md

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None, checksum=True):
    """tensors: [(name, dtype, shape, raw bytes)]. Lays them out as cohort's writer does: metadata first,
    contiguous data in the given order, header padded with spaces to a multiple of 8."""
    data = b"".join(raw for _, _, _, raw in tensors)
    meta = dict(metadata or {})
    if checksum:
        meta["cohort.crc32c"] = "%08x" % crc32c(data)
    header = {}
    if meta:
        header["__metadata__"] = dict(sorted(meta.items()))
    offset = 0
    for name, dtype, shape, raw in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        assert n == len(raw), name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def i64(*values):
    return struct.pack("<%dq" % len(values), *values)


def idx(dims, payload):
    return bytes([0, 0, 0x08, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(payload)


def write(harness, name, data):
    folder = CORPUS / harness
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def main():
    if CORPUS.exists():
        shutil.rmtree(CORPUS)

    # --- safetensors
    write("fuzz_safetensors", "two_tensors.safetensors",
          safetensors([("fc.weight", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6)), ("fc.bias", "F32", [2], f32(0.5, -0.5))],
                      {"format": "pt"}))
    write("fuzz_safetensors", "dtypes.safetensors",
          safetensors([("a", "I64", [3], i64(1, -2, 3)), ("b", "BF16", [2], b"\x80\x3f\x00\x40"),
                       ("c", "BOOL", [4], b"\x01\x00\x01\x01"), ("empty", "U8", [0], b""),
                       ("d", "F16", [1, 2], b"\x00\x3c\x00\xc0"), ("e", "I8", [2], b"\x7f\x80"),
                       ("f", "I16", [1], b"\x01\x02"), ("g", "I32", [1], b"\x01\x02\x03\x04"),
                       ("h", "F64", [], struct.pack("<d", 3.25))]))
    write("fuzz_safetensors", "no_metadata.safetensors",
          safetensors([("w", "U8", [2, 2], b"\x01\x02\x03\x04")], checksum=False))

    # --- the training state: <tag>.state.safetensors as checkpoint::save writes it
    state_meta = {"cohort.format": "cohort-train-state", "cohort.version": "1", "step": "100", "epoch": "2",
                  "best_test_accuracy": "0.851200", "world_size": "2",
                  "config": json.dumps({"data.batch_size": 128, "model.name": "resnet8"})}
    write("fuzz_checkpoint_state", "last.state.safetensors",
          safetensors([("momentum.fc.weight", "F32", [2, 2], f32(0.1, 0.2, 0.3, 0.4)), ("step", "I64", [], i64(100))],
                      state_meta))
    write("fuzz_checkpoint_state", "no_tensors.state.safetensors", safetensors([], state_meta))

    # --- the sharded manifest and commit marker, as save_sharded writes them (world 2, one unit)
    manifest = {
        "buffers": ["bn1.running_mean", "bn1.num_batches_tracked"],
        "kinds": ["momentum"],
        "units": [{"numel": 8, "padded": 8, "shard": 4,
                   "params": [{"name": "fc.weight", "shape": [2, 3], "offset": 0},
                              {"name": "fc.bias", "shape": [2], "offset": 6}]},
                  {"numel": 1, "padded": 2, "shard": 1, "params": [{"name": "scale", "shape": [], "offset": 0}]}],
        "world_size": 2, "format": "cohort-sharded", "version": 1, "tag": "last", "step": 10, "epoch": 1,
        "best_test_accuracy": 0.5, "config": json.dumps({"dist.strategy": "fsdp"}),
        "files": ["last.shard-00000-of-00002.safetensors", "last.shard-00001-of-00002.safetensors"],
    }
    write("fuzz_manifest", "last.manifest.json", json.dumps(manifest, indent=1) + "\n")
    write("fuzz_manifest", "last.commit", json.dumps({"step": 10, "world_size": 2}) + "\n")
    write("fuzz_manifest", "commit_marker.json",
          json.dumps({"files": [{"bytes": 1234, "name": "last.safetensors"},
                                {"bytes": 99, "name": "last.state.safetensors"}], "step": 120}, indent=1) + "\n")

    # --- IDX: labels and images, raw and gzip (mtime 0 keeps the bytes reproducible)
    labels = idx([6], [9, 0, 3, 3, 1, 7])
    images = idx([2, 3, 4], range(24))
    write("fuzz_idx", "labels-idx1-ubyte", labels)
    write("fuzz_idx", "images-idx3-ubyte", images)
    write("fuzz_idx", "labels-idx1-ubyte.gz", gzip.compress(labels, mtime=0))
    write("fuzz_idx", "images-idx3-ubyte.gz", gzip.compress(images, mtime=0))
    write("fuzz_idx", "images-4d-idx.gz", gzip.compress(idx([1, 2, 2, 2], range(8)), mtime=0))

    # --- CIFAR-10: one and two records (label byte, then 3072 pixel bytes)
    record = lambda label, seed: bytes([label]) + bytes((seed + i * 7) % 256 for i in range(3072))
    write("fuzz_cifar10", "one_record.bin", record(3, 0))
    write("fuzz_cifar10", "two_records.bin", record(0, 1) + record(9, 2))

    # --- config: the shipped files, and one touching every kind of value and a dotted key
    for toml in sorted((ROOT / "configs").glob("*.toml")):
        write("fuzz_config", toml.name, toml.read_bytes())
    write("fuzz_config", "every_type.toml", "\n".join([
        'model.name = "resnet8"',
        "[data]", 'name = "fashion-mnist"', "batch_size = 64", "augment = false", 'on_bad_file = "fail"',
        "[train]", "epochs = 1", "seed = '18446744073709551615'", "max_steps = 0",
        "[optim]", "lr = 1.5e-1", "momentum = 0.0", "nesterov = false",
        "[sched]", 'name = "cosine"', "warmup_epochs = 0.5", "min_lr_factor = 0.01",
        "[dist]", 'strategy = "ddp"', 'compress = "powersgd"', "bucket_mb = 25", "first_bucket_mb = 1",
        "[powersgd]", "rank = 2",
        "[ckpt]", 'upload = "s3://bucket/prefix"', "every_steps = 10",
        "[eval]", "tta = 2",
        "[log]", 'progress = "plain"', "monitor_s = 0",
        "[run]", "dir = 'runs/x'",
    ]) + "\n")

    # --- the store's wire protocol (StoreProtocol.h): every request, a response, the handshake, and frames
    u32 = lambda v: struct.pack("<I", v)
    key = lambda k: u32(len(k)) + k
    requests = {
        "set": b"\x01" + key(b"/worker/attempt_0/addr0") + key(b"127.0.0.1:29500"),
        "get": b"\x02" + key(b"rank0"),
        "add": b"\x03" + key(b"counter") + struct.pack("<q", -3),
        "compare_set": b"\x04" + key(b"k") + key(b"old") + key(b"new"),
        "delete": b"\x05" + key(b"k"),
        "check": b"\x06" + u32(2) + key(b"a") + key(b"b"),
        "num_keys": b"\x07",
        "wait": b"\x08" + struct.pack("<q", 30000) + u32(1) + key(b"ready"),
    }
    for name, payload in requests.items():
        write("fuzz_store_protocol", "request_" + name, payload)
    write("fuzz_store_protocol", "response_value", b"\x00" + struct.pack("<q", 7) + key(b"value"))
    nonce, mac = bytes(range(32)), bytes(range(100, 132))
    write("fuzz_store_protocol", "hello", b"COHS\x01" + nonce)
    auth = b"COHA" + nonce + mac
    write("fuzz_store_protocol", "auth", auth)
    write("fuzz_store_protocol", "auth_ok", b"COHK" + mac)
    write("fuzz_store_protocol", "auth_refused", b"COHF" + b"wrong secret")
    frame = lambda payload: u32(len(payload)) + payload
    write("fuzz_store_protocol", "frames", frame(auth) + frame(requests["set"]) + frame(requests["wait"]))


if __name__ == "__main__":
    main()
