"""Where a DeML(3,3) training step spends its time, against the GAP baseline's (issue 52 item 7: on an H200 its step
took 7.43 times GAP's where its forward FLOPs are 5.53 times).

Both models on the same backbone, size and batch (the measurement's: torchvision's GoogLeNet, 224 px, batch 64),
a step being forward, ``.float()`` and backward of the embedding and parts, as ``heads_step_time.py`` times it.
After ``--warmup`` steps each, ``--steps`` steps of each model run under ``torch.profiler`` and the script reports:

- each model's step time (median, timed from an idle device), their ratio and the forward FLOP ratio;
- the device's busy time per step (the sum of its kernels' times, each once: until 2026-11-28 the script counted
  every kernel twice, under its operator and on its own row, so the H200 run of that day reported double) and so its
  idle share: time the GPU waits on
  the host (Python, the launch of many small kernels, and host-side work such as DeML's object-attention boxes,
  computed with SciPy on the CPU after a copy of the maps from the GPU);
- the forward time of each module of the trunk and the head (three levels down, and summed over each scale's
  ``fnets`` and ``gnets`` stages) and of each function DeML's head
  calls between its networks (``record_function`` ranges: host time, and on a GPU the device time of the kernels
  launched inside and the range's span on the device's timeline, which counts the device's waits inside it: for
  DeML's ``attention_boxes``, the host's SciPy work between the copy of the maps and that of the boxes);
- the operators that take the most device time (self), and the host-device copies and synchronisations.

    .venv/bin/python benchmarks/deml_profile.py [--device cuda] [--backbone googlenet] [--size 224] [--batch 64] \\
        [--steps 10] [--warmup 3] [--scales 3] [--branches 3] [--out FILE]

Prints the tables and writes benchmarks/results/deml_profile[_<device>].json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _results import environment, forward_macs, synchronize, timed, write_result
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from deepmetric import create_model

COPIES_AND_SYNCS = ("Memcpy", "memcpy", "Synchronize", "aten::item", "aten::_local_scalar_dense", "aten::to",
                    "aten::copy_")
"""Operators (substrings of their names) that copy between host and device or wait for the device."""


def step(model: torch.nn.Module, images: torch.Tensor) -> None:
    out = model(images).float()
    (out.embedding.sum() + sum(p.sum() for p in out.parts)).backward()
    model.zero_grad(set_to_none=True)


HEAD_FUNCTIONS = ("object_attention", "attention_boxes", "crop_and_zoom", "paste", "compose_boxes")
"""The functions of DeML's forward pass between its networks (``models/heads/deml.py``): the object attention map,
its box (connected components with SciPy on the host), the crop and zoom of the next scale, and their bookkeeping."""


@contextlib.contextmanager
def labelled(model: torch.nn.Module) -> Iterator[None]:
    """A ``record_function`` range around the forward pass of each module of the trunk and the head down to three
    levels (DeML calls the stages of ``fnets[i]`` and ``gnets[i]`` one by one, never the ``Sequential`` or the
    ``ModuleList``) and around each of DeML's ``HEAD_FUNCTIONS``; the profiler then gives each range's host and
    device time, its calls' included."""
    import deepmetric.models.heads.deml as deml_module

    handles, open_ranges, originals = [], {}, {}
    for part in ("trunk", "head"):
        for name, module in getattr(model, part).named_modules():
            if not name or name.count(".") > 2 or isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict):
                continue
            label = f"module {part}.{name}"

            def enter(module: torch.nn.Module, args: Any, label: str = label) -> None:
                open_ranges[label] = record_function(label)
                open_ranges[label].__enter__()

            def leave(module: torch.nn.Module, args: Any, output: Any, label: str = label) -> None:
                open_ranges.pop(label).__exit__(None, None, None)

            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    for name in HEAD_FUNCTIONS:
        original = originals[name] = getattr(deml_module, name)

        def wrapped(*args: Any, original: Any = original, name: str = name, **kwargs: Any) -> Any:
            with record_function(f"function {name}"):
                return original(*args, **kwargs)

        setattr(deml_module, name, wrapped)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for name, original in originals.items():
            setattr(deml_module, name, original)


def device_time_us(event: Any, device: torch.device, total: bool = False) -> float:
    """An event's self time (``total``: with its children's) on ``device`` in microseconds (the CPU's when ``device``
    is the CPU)."""
    kind = "" if total else "self_"
    if device.type == "cuda":
        return float(getattr(event, f"{kind}device_time_total", getattr(event, f"{kind}cuda_time_total", 0.0)))
    return float(getattr(event, f"{kind}cpu_time_total"))


def is_label(key: str) -> bool:
    return key.startswith(("module ", "function "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbone", default="googlenet")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--scales", type=int, default=3)
    parser.add_argument("--branches", type=int, default=3)
    parser.add_argument("--top", type=int, default=20, help="operators listed")
    parser.add_argument("--out")
    args = parser.parse_args()

    device = torch.device(args.device)
    models = {"gap": create_model(backbone=args.backbone, head="gap", pretrained=False),
              f"deml({args.scales},{args.branches})": create_model(
                  backbone=args.backbone, head="deml", pretrained=False, num_scales=args.scales,
                  num_branches=args.branches)}
    images = torch.rand(args.batch, 3, args.size, args.size, device=device)
    macs = {}
    for name, model in models.items():
        model.to(device).train()
        macs[name] = forward_macs(model, images[:2])
        for _ in range(args.warmup):
            step(model, images)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.steps):  # interleaved, as heads_step_time.py
        for name, model in models.items():
            times[name].append(timed(lambda model=model: step(model, images), device))
    gap, deml = list(models)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiles = {}
    for name, model in models.items():
        with labelled(model), profile(activities=activities) as prof:
            for _ in range(args.steps):
                step(model, images)
            synchronize(device)
        profiles[name] = prof.key_averages()
    result: dict[str, Any] = {"benchmark": "deml_profile", "backbone": args.backbone, "image_size": args.size,
                              "batch": args.batch, "steps": args.steps, **environment(device), "models": {}}
    for name in models:
        step_s = statistics.median(times[name])
        events = profiles[name]
        # the host's operators and ranges; the device's own rows (its kernels and copies, and on a GPU each range
        # again, as a span of the device's timeline under the same name) are read apart: listed with the host's,
        # every kernel would count twice and a range's host row would be overwritten by its device row
        host = [e for e in events if e.device_type == DeviceType.CPU]
        spans = {e.key: e for e in events if e.device_type != DeviceType.CPU and is_label(e.key)}
        busy_us = sum(device_time_us(e, device) for e in host if not is_label(e.key))
        ranges = {e.key: {"host_ms": e.cpu_time_total / args.steps / 1e3,
                          "device_ms": device_time_us(e, device, total=True) / args.steps / 1e3,
                          "device_span_ms": (spans[e.key].device_time_total / args.steps / 1e3
                                             if e.key in spans else None),
                          "calls": e.count / args.steps} for e in host if is_label(e.key)}
        for key, row in list(ranges.items()):  # DeML's per-scale networks, from their stages
            parts = key.removeprefix("module head.").split(".")
            if parts[0] in ("fnets", "gnets") and len(parts) == 3:
                total = ranges.setdefault(f"module head.{parts[0]}.{parts[1]} (its stages)",
                                          {"host_ms": 0.0, "device_ms": 0.0, "device_span_ms": None,
                                           "calls": row["calls"]})
                total["host_ms"] += row["host_ms"]
                total["device_ms"] += row["device_ms"]
        top = sorted((e for e in host if not is_label(e.key)), key=lambda e: device_time_us(e, device),
                     reverse=True)[:args.top]
        copies = {e.key: {"count": e.count / args.steps, "cpu_ms": e.cpu_time_total / args.steps / 1e3}
                  for e in events if any(k in e.key for k in COPIES_AND_SYNCS)}
        result["models"][name] = {
            "step_ms": 1e3 * step_s, "gmacs_forward": macs[name] / 1e9,
            "device_busy_ms": busy_us / args.steps / 1e3 if device.type == "cuda" else None,
            "forward_ms_by_range": ranges,
            "top_ops": [{"op": e.key, "self_device_ms": device_time_us(e, device) / args.steps / 1e3,
                         "calls": e.count / args.steps} for e in top],
            "copies_and_syncs": copies}
    g, d = result["models"][gap], result["models"][deml]
    result["time_ratio"] = d["step_ms"] / g["step_ms"]
    result["flop_ratio"] = d["gmacs_forward"] / g["gmacs_forward"]
    print(f"{args.backbone}, {args.size} px, batch {args.batch}, {device}: {deml} step {d['step_ms']:.1f} ms, "
          f"{gap} {g['step_ms']:.1f} ms: time x{result['time_ratio']:.2f}, forward FLOPs x{result['flop_ratio']:.2f}")
    for name in models:
        row = result["models"][name]
        if row["device_busy_ms"] is not None:
            idle = 1 - row["device_busy_ms"] / row["step_ms"]
            print(f"{name}: device busy {row['device_busy_ms']:.1f} ms a step of {row['step_ms']:.1f} ms "
                  f"(idle {100 * idle:.0f}%)")
    for name in models:
        print(f"\n{name}: the forward pass by module and function (ms a step; device: its kernels, its calls' "
              "included)")
        print(f"  {'range':<48}{'host ms':>10}{'device ms':>11}{'span ms':>9}{'calls':>7}")
        for label, row in sorted(result["models"][name]["forward_ms_by_range"].items(),
                                 key=lambda kv: -kv[1]["host_ms"])[:args.top]:
            span = "-" if row["device_span_ms"] is None else f"{row['device_span_ms']:.2f}"
            print(f"  {label[:48]:<48}{row['host_ms']:>10.2f}{row['device_ms']:>11.2f}{span:>9}{row['calls']:>7.0f}")
    for name in models:
        print(f"\n{name}: top operators by self {'device' if device.type == 'cuda' else 'CPU'} time (ms a step)")
        for op in result["models"][name]["top_ops"]:
            print(f"  {op['op'][:60]:<60}{op['self_device_ms']:>9.2f}{op['calls']:>8.0f} calls")
        print(f"{name}: copies and synchronisations (a step)")
        for key, value in sorted(result["models"][name]["copies_and_syncs"].items()):
            print(f"  {key[:60]:<60}{value['count']:>8.1f} x {value['cpu_ms']:>8.2f} ms host")
    suffix = "" if device.type == "cpu" else "_" + torch.cuda.get_device_name(device).split()[1].lower()
    out = args.out or Path(__file__).parent / "results" / f"deml_profile{suffix}.json"
    write_result(out, result)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
