#!/usr/bin/env python3
"""PyTorch-in-Python peer of bench/gpu_train_step (the C++ bench): one process, one device, a training step
timed on synthetic data, ONE JSON object on stdout. Both take the same arguments and print the same keys;
this one says "impl": "torch", cohort's says "impl": "cohort". bench/gpu_compare.py runs the two in turns.

What a step is (the C++ bench must do the same for the comparison to be fair):
  - Model: torchvision resnet50 / resnet18 / vit_b_32 (cohort calls it vit_b32; num_classes --classes), or
    airbench94 written out below to match cohort's src/cohort/models/Airbench.{h,cpp} layer for layer.
  - SGD, lr 0.01, momentum 0.9, Nesterov, weight decay 5e-4 on every trainable parameter (one group; the
    optimizer is torch.optim.SGD with its default implementation, foreach on CUDA).
  - Cross-entropy with label smoothing 0.1 (airbench94: 0.2), mean over the batch; logits go to the loss
    in float32.
  - --precision fp32: no autocast (PyTorch's and LibTorch's defaults alike: cuDNN convolutions may use TF32,
    matrix products do not). bf16: torch.autocast(dtype=bfloat16). fp16: autocast(float16) + GradScaler
    (default scaling constants). fp16-master (Apex O2): the model in float16 except its BatchNorm layers,
    which stay float32; input cast to float16; float32 master copies of every parameter live in the
    optimizer: grads are copied to them, GradScaler unscales and steps them, then they are copied back.
  - --channels-last: model and input in torch.channels_last.
  - cudnn.benchmark on (cohort's train.cudnn_benchmark).
  - ResNets: one random batch [B, 3, S, S] (normal) and labels, resident on the device; --warmup untimed
    steps, then --steps timed ones between two device synchronizations. images/s = steps * B / seconds.
  - airbench94 with --epochs E: a random uint8 dataset [--dataset-size, 3, S, S] and its labels resident on
    the device. Each epoch: one randperm; batches of B taken in order, the last partial one dropped; each
    batch is gathered, converted to float, scaled by 1/255, normalized with CIFAR-10's mean/std, flipped
    horizontally per image with p = 0.5 (torch.where on a random mask), made channels-last if asked and
    float16 for fp16-master. --warmup untimed steps first (on the first batches of a permutation), then
    the E epochs are timed as a whole between two synchronizations. seconds = that time.
  - peak_memory_bytes: torch.cuda.max_memory_allocated() over the whole run (LibTorch:
    CUDACachingAllocator::getDeviceStats(dev).allocated_bytes[0].peak).
  - --cuda-graph: whole-step capture as in PyTorch's CUDA graphs docs ("whole network capture"): static
    input and label tensors, three eager warm-up steps on a side stream, zero_grad(set_to_none=True), then
    capture forward, loss and backward, and the optimizer step too for fp32 / bf16. GradScaler.step syncs
    with the host, which capture forbids, so for fp16 / fp16-master the unscale, step and scale update stay
    eager after each replay (the docs' advice). Autocast inside capture runs with cache_enabled=False.

Smoke run on a CPU (Debian's PyTorch 1.13 works):
  /usr/bin/python3 bench/peers/torch_train_step.py --device cpu --model resnet18 --batch 4 --steps 2 \\
      --image 64 --precision fp32
"""
import argparse
import collections
import contextlib
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["resnet50", "resnet18", "vit_b32", "airbench94", "resnet20"], default="resnet50")
    ap.add_argument("--batch", type=int, default=None, help="default: 256, airbench94 1024")
    ap.add_argument("--image", type=int, default=None, help="default: 224, airbench94 32")
    ap.add_argument("--classes", type=int, default=None, help="default: 1000, airbench94 10")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16", "fp16-master"], default="fp32")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--steps", type=int, default=50, help="timed steps (ResNets, or airbench94 without --epochs)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--epochs", type=int, default=0, help="airbench94: time this many whole epochs instead")
    ap.add_argument("--dataset-size", type=int, default=50000, help="airbench94 with --epochs: images")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--foreach", choices=["auto", "true", "false"], default="auto",
                    help="torch.optim.SGD's foreach (auto: None, PyTorch's default: on for CUDA)")
    ap.add_argument("--count-ops", action="store_true",
                    help="count ATen operator calls per timed step with the profiler (slows the step: not for images/s)")
    ap.add_argument("--phases", action="store_true",
                    help="sync after forward, backward, unscale, optimizer and zero_grad and time each (as "
                         "gpu_train_step --phases); not for the images/s runs")
    a = ap.parse_args(argv)
    airbench = a.model == "airbench94"
    cifar = airbench or a.model == "resnet20"
    a.batch = a.batch or (1024 if airbench else 256)
    a.image = a.image or (32 if cifar else 224)
    a.classes = a.classes or (10 if cifar else 1000)
    if a.epochs and not airbench:
        ap.error("--epochs is for --model airbench94 (the ResNets time --steps)")
    if a.epochs and a.dataset_size < a.batch:
        ap.error(f"--dataset-size {a.dataset_size} is smaller than one batch ({a.batch})")
    for name in ("batch", "image", "classes", "steps"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if a.warmup < 0 or a.epochs < 0:
        ap.error("--warmup and --epochs must be >= 0")
    return a


# ---- airbench94, as cohort's src/cohort/models/Airbench.cpp builds it ----

def dirac_init_(conv):
    # airbench's Conv.reset_parameters: after the default init, the first min(out, in) filters become
    # identities through the kernel centre; a bias is zeroed.
    with torch.no_grad():
        w = conv.weight
        nn.init.dirac_(w[: min(w.size(0), w.size(1))])
        if conv.bias is not None:
            conv.bias.zero_()


def airbench_batch_norm(channels):
    # airbench's "momentum 0.6" is PyTorch's momentum 0.4; the scale stays 1 and never trains.
    bn = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
    bn.weight.requires_grad_(False)
    return bn


def conv3x3(cin, cout):
    conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
    dirac_init_(conv)
    return conv


class ConvGroup(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = conv3x3(cin, cout)
        self.norm1 = airbench_batch_norm(cout)
        self.conv2 = conv3x3(cout, cout)
        self.norm2 = airbench_batch_norm(cout)

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2)
        x = F.gelu(self.norm1(x))
        return F.gelu(self.norm2(self.conv2(x)))


class Airbench94(nn.Module):
    def __init__(self, in_channels=3, num_classes=10, width_scale=1):
        super().__init__()
        k = 2
        whiten_width = 2 * in_channels * k * k  # 24 for RGB
        self.whiten = nn.Conv2d(in_channels, whiten_width, k, padding=0, bias=True)
        dirac_init_(self.whiten)
        # Frozen, as in cohort; its values (set from the data's patch covariance there) do not change the
        # step's cost, so the peer keeps the dirac init.
        self.whiten.weight.requires_grad_(False)
        base = 64 * width_scale
        widths = [base, 4 * base, 4 * base]
        layers, ch = [], whiten_width
        for w in widths:
            layers.append(ConvGroup(ch, w))
            ch = w
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(ch, num_classes, bias=False)

    def forward(self, x):
        x = F.gelu(self.whiten(x))
        for group in self.layers:
            x = group(x)
        # cohort: std::get<0>(x.flatten(2).max(2)), a max over the whole remaining map (3x3 for 32x32).
        x = x.flatten(2).max(2).values
        return self.head(x) * (1.0 / 9.0)


def small_resnet(blocks, width, channels, classes):
    """cohort's SmallResNet (resnet8 .. resnet32): a 3x3 stem, three stages of torchvision's BasicBlock at
    widths w, 2w, 4w. tests/reference/flops.py counts its FLOPs from this definition too."""
    from torchvision.models.resnet import BasicBlock
    layers, cin = [nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()], width
    for stage, w in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            down = None if stride == 1 and cin == w else nn.Sequential(nn.Conv2d(cin, w, 1, stride, bias=False),
                                                                       nn.BatchNorm2d(w))
            layers.append(BasicBlock(cin, w, stride, down))
            cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def build_model(a):
    if a.model == "airbench94":
        return Airbench94(3, a.classes)
    if a.model == "resnet20":  # configs/cifar10_resnet.toml's: width 16
        return small_resnet(3, 16, 3, a.classes)
    import torchvision
    name = {"vit_b32": "vit_b_32"}.get(a.model, a.model)  # cohort's name for torchvision's model
    return getattr(torchvision.models, name)(num_classes=a.classes)


# ---- precision ----

def make_grad_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")  # 2.3+
    return torch.cuda.amp.GradScaler()


def autocast_factory(a, in_graph=False):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    if dtype is None:
        return contextlib.nullcontext
    # The autocast weight cache cannot outlive a graph capture (PyTorch's CUDA graphs docs).
    kwargs = {"cache_enabled": False} if in_graph else {}
    return lambda: torch.autocast(a.device, dtype=dtype, **kwargs)


def foreach_copy_(dst, src):
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


class Step:
    """One training step; eager or replayed from a CUDA graph."""

    def __init__(self, a, model, input_dtype):
        self.a = a
        self.model = model
        self.input_dtype = input_dtype
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=0.2 if a.model == "airbench94" else 0.1)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = None
        if a.precision == "fp16-master":
            # Apex O2: float32 master weights in the optimizer; the model's own (mostly fp16) weights are
            # what forward and backward use.
            self.master = [p.detach().float().clone() for p in self.params]
            for m in self.master:
                m.grad = torch.zeros_like(m)
        foreach = {"auto": None, "true": True, "false": False}[a.foreach]
        self.opt = torch.optim.SGD(self.master or self.params, lr=0.01, momentum=0.9, nesterov=True,
                                   weight_decay=5e-4, foreach=foreach)
        self.scaler = make_grad_scaler() if a.precision in ("fp16", "fp16-master") else None
        self.autocast = autocast_factory(a)
        self.graph = None
        self.note = None
        self.phase_seconds = None  # {phase: seconds} while --phases timing is on
        self.last = 0.0

    def mark(self, phase):
        if self.phase_seconds is None:
            return
        torch.cuda.synchronize() if self.a.device == "cuda" else None
        now = time.perf_counter()
        if phase is not None:
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def _forward_backward(self, x, y, autocast):
        with autocast():
            loss = self.loss_fn(self.model(x).float(), y)
        self.mark("forward")
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        self.mark("backward")
        return loss

    def _optimizer_step(self):
        if self.scaler is None:
            self.mark("unscale")
            self.opt.step()
            self.mark("optimizer")
            return
        if self.master is not None:
            foreach_copy_([m.grad for m in self.master], [p.grad for p in self.params])
        self.scaler.unscale_(self.opt)  # what scaler.step would do first; timed apart
        self.mark("unscale")
        self.scaler.step(self.opt)  # skips the step on inf/NaN
        self.scaler.update()
        if self.master is not None:
            foreach_copy_([p.data for p in self.params], self.master)
        self.mark("optimizer")

    def _clear_grads(self):
        # The master copies keep their .grad tensors: each step overwrites them from the model's grads.
        if self.master is None:
            self.opt.zero_grad(set_to_none=True)
        else:
            for p in self.params:
                p.grad = None

    def eager(self, x, y):
        self.mark(None)
        self._clear_grads()
        self.mark("zero_grad")
        self._forward_backward(x, y, self.autocast)
        self._optimizer_step()

    def capture(self, x, y):
        """Capture on static x, y (the caller copies each batch into them before run())."""
        self.static_x, self.static_y = x, y
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # momentum buffers, the scaler's state and cuDNN plans exist before capture
                self.eager(x, y)
        torch.cuda.current_stream().wait_stream(side)
        whole = self.scaler is None
        # Grads start as None so the captured backward allocates them in the graph's pool and every
        # replay overwrites them (no accumulation, no zero_grad in the loop).
        self._clear_grads()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._forward_backward(x, y, autocast_factory(self.a, in_graph=True))
            if whole:
                self.opt.step()
        self.whole = whole
        self.note = ("whole step captured" if whole else
                     "forward+loss+backward captured; GradScaler unscale/step/update eager after each replay")

    def run(self, x, y):
        if self.graph is None:
            self.eager(x, y)
            return
        if x is not self.static_x:
            self.static_x.copy_(x)
            self.static_y.copy_(y)
        self.graph.replay()
        if not self.whole:
            self._optimizer_step()


class OpCount:
    """--count-ops: ATen operator calls in the timed steps, as the profiler records them (only "aten::"
    events: autograd's nodes and the optimizer's scopes are not operators), per step and by name. Every
    call, nested ones included, and the top-level calls: those with no "aten::" event above them.
    gpu_train_step --count-ops counts the same calls through RecordFunction."""

    def __init__(self, on):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if on else None

    def start(self):
        if self.prof is not None:
            self.prof.__enter__()

    def stop(self):
        if self.prof is not None:
            self.prof.__exit__(None, None, None)

    def report(self, steps):
        def nested(e):
            p = e.cpu_parent
            while p is not None:
                if p.name.startswith("aten::"):
                    return True
                p = p.cpu_parent
            return False

        events = [e for e in self.prof.events() if e.name.startswith("aten::")]
        every = collections.Counter(e.name for e in events)
        top = collections.Counter(e.name for e in events if not nested(e))
        return {"ops_per_step": sum(every.values()) / steps, "top_level_ops_per_step": sum(top.values()) / steps,
                "distinct_ops": len(every),
                "ops_per_step_by_name": {n: c / steps for n, c in every.most_common()},
                "top_level_ops_per_step_by_name": {n: c / steps for n, c in top.most_common()}}


def sync(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_train_step: --device cuda but torch.cuda.is_available() is False "
                 f"(torch {torch.__version__}); use --device cpu for a smoke run")
    if a.device == "cpu" and a.precision in ("fp16", "fp16-master"):
        sys.exit(f"torch_train_step: --precision {a.precision} needs --device cuda (GradScaler and fp16 "
                 "convolutions are CUDA features here)")
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format

    model = build_model(a).to(dev)
    input_dtype = torch.float32
    if a.precision == "fp16-master":
        model.half()
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.float()  # Apex O2 keeps batch norm in float32
        input_dtype = torch.float16
    model = model.to(memory_format=fmt)
    model.train()
    step = Step(a, model, input_dtype)

    notes = []
    ops = OpCount(a.count_ops)
    use_graph = a.cuda_graph and a.device == "cuda"
    if a.cuda_graph and not use_graph:
        notes.append("--cuda-graph skipped: CUDA graphs need --device cuda")

    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    B, S = a.batch, a.image
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    if a.epochs:
        data = torch.randint(0, 256, (a.dataset_size, 3, S, S), dtype=torch.uint8, device=dev, generator=gen)
        targets = torch.randint(0, a.classes, (a.dataset_size,), device=dev, generator=gen)
        mean = torch.tensor(CIFAR10_MEAN, device=dev).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR10_STD, device=dev).view(1, 3, 1, 1)
        steps_per_epoch = a.dataset_size // B

        def batches():
            # One pass over the dataset in a fresh random order; the last partial batch is dropped.
            perm = torch.randperm(a.dataset_size, device=dev, generator=gen)
            for i in range(steps_per_epoch):
                idx = perm[i * B:(i + 1) * B]
                x = (data[idx].float() / 255 - mean) / std
                flip = torch.rand(B, device=dev, generator=gen) < 0.5
                x = torch.where(flip.view(B, 1, 1, 1), x.flip(3), x)
                yield x.to(dtype=input_dtype, memory_format=fmt), targets[idx]

        first_x, first_y = next(batches())
        if use_graph:
            step.capture(first_x.clone(), first_y.clone())
        warm = 0
        while warm < a.warmup:
            for x, y in batches():
                if warm == a.warmup:
                    break
                step.run(x, y)
                warm += 1
        sync(a)
        ops.start()
        t0 = time.perf_counter()
        for _ in range(a.epochs):
            for x, y in batches():
                step.run(x, y)
        sync(a)
        seconds = time.perf_counter() - t0
        timed_steps = a.epochs * steps_per_epoch
    else:
        x = torch.randn(B, 3, S, S, device=dev, generator=gen).to(dtype=input_dtype, memory_format=fmt)
        y = torch.randint(0, a.classes, (B,), device=dev, generator=gen)
        if use_graph:
            step.capture(x, y)
        for _ in range(a.warmup):
            step.run(x, y)
        if a.phases and not use_graph:
            step.phase_seconds = {}
        elif a.phases:
            notes.append("--phases skipped: the step is a graph replay")
        sync(a)
        ops.start()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step.run(x, y)
        sync(a)
        seconds = time.perf_counter() - t0
        timed_steps = a.steps

    ops.stop()
    if step.note:
        notes.append(step.note)
    out = {
        "impl": "torch",
        "model": a.model,
        "precision": a.precision,
        "batch": B,
        "image": S,
        "classes": a.classes,
        "channels_last": a.channels_last,
        "cuda_graph": use_graph,
        "foreach": a.foreach,
        "steps": timed_steps,
        "warmup": a.warmup,
        "epochs": a.epochs or None,
        "dataset_size": a.dataset_size if a.epochs else None,
        "images_per_second": timed_steps * B / seconds,
        "seconds": seconds,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None,
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if step.phase_seconds is not None:
        out["phase_ms"] = {k: 1e3 * v / timed_steps for k, v in sorted(step.phase_seconds.items())}
    if step.scaler is not None:
        out["final_loss_scale"] = float(step.scaler.get_scale())
    if a.count_ops:
        out.update(ops.report(timed_steps))
    if notes:
        out["note"] = "; ".join(notes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
