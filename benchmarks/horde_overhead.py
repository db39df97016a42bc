"""Training-step time with the HORDE regulariser against the same model without it (thesis §5.5.4: "around
30% of additional training time" with the first six orders on GoogLeNet).

Both set-ups start from the same weights and run in one process on the same batch, interleaved, after
warm-up steps; the ratio of their median step times is reported beside the ratio of their FLOPs (matrix
products and convolutions of the forward and backward passes, counted by ``torch.utils.flop_counter``; the
optimiser's element-wise updates are not counted).

    PYTHONPATH=src .venv/bin/python benchmarks/horde_overhead.py [--backbone inception-v1] [--size 128] \\
        [--batch 40] [--orders 5] [--dim 8192] [--mode cascaded] [--repeats 5]

Prints a table and writes benchmarks/results/horde_overhead.json.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
from pathlib import Path

import torch
from _results import environment, timed, write_result
from torch.utils.flop_counter import FlopCounterMode

from deepmetric import create_model
from deepmetric.config import build_config
from deepmetric.losses import build_objective


def step(model, objective, optimizer, images, labels, amp: bool = False) -> None:
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
        output = model(images)
    loss, _ = objective(output.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def flops(model, objective, images, labels) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = objective(model(images), labels)
        loss.backward()
    model.zero_grad(set_to_none=True)
    objective.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="inception-v1", help="original GoogLeNet, random weights (timing only)")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=40, help="P x K = 5 x 8 (the thesis' CUB/Cars batches)")
    parser.add_argument("--orders", type=int, default=5, help="highest order K (orders 2..K)")
    parser.add_argument("--dim", type=int, default=8192)
    parser.add_argument("--mode", default="cascaded")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--amp", action="store_true", help="forward passes under bfloat16 autocast")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "horde_overhead.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = create_model(args.backbone, pretrained=False, embedding_dim=512).set_channels_last(True).to(device)
    images = torch.rand(args.batch, 3, args.size, args.size).to(device)
    labels = torch.arange(args.batch // 8 + 1).repeat_interleave(8)[: args.batch].to(device)
    horde = {"orders": args.orders, "dim": args.dim, "mode": args.mode}
    setups = {}
    for name, regularizers in (("baseline", {}), ("horde", {"horde": horde})):
        copy_ = copy.deepcopy(model)
        config = build_config({"loss": {"name": "binomial", "regularizers": regularizers}})
        objective = build_objective(config.loss, copy_.head, num_classes=args.batch // 8 + 1).to(device)
        optimizer = torch.optim.Adam([*copy_.parameters(), *objective.parameters()], lr=1e-5)
        setups[name] = (copy_.train(), objective, optimizer)
    counted = {name: flops(m, o, images, labels) for name, (m, o, _) in setups.items()}
    feature_map = setups["horde"][0](images).extras["feature_map"]
    times: dict[str, list[float]] = {name: [] for name in setups}
    for repeat in range(args.warmup + args.repeats):
        for name, (m, o, opt) in setups.items():
            elapsed = timed(functools.partial(step, m, o, opt, images, labels, args.amp), device)
            if repeat >= args.warmup:
                times[name].append(elapsed)
    median = {name: statistics.median(values) for name, values in times.items()}
    time_ratio = median["horde"] / median["baseline"]
    flop_ratio = counted["horde"] / counted["baseline"]
    parameters = {name: sum(p.numel() for p in [*m.parameters(), *o.parameters()])
                  for name, (m, o, _) in setups.items()}
    result = {
        "benchmark": "horde_overhead", "backbone": args.backbone, "image_size": args.size, "batch": args.batch,
        "feature_map": list(feature_map.shape[1:]), "horde": horde, "repeats": args.repeats, "amp": args.amp,
        **environment(device),
        "median_seconds": median, "all_seconds": times, "flops": counted, "parameters": parameters,
        "time_ratio": time_ratio, "flop_ratio": flop_ratio,
        "time_ratio_within_10pct_of_flop_ratio": abs(time_ratio - flop_ratio) <= 0.1 * flop_ratio,
    }
    print(f"{args.backbone}, {args.size}x{args.size}, batch {args.batch}, feature map {tuple(feature_map.shape[1:])}, "
          f"HORDE {args.mode} orders 2..{args.orders}, d = {args.dim}; {torch.get_num_threads()} threads")
    print(f"{'set-up':<10}{'median s/step':>15}{'GFLOP/step':>12}{'parameters':>14}")
    for name in setups:
        print(f"{name:<10}{median[name]:>15.4f}{counted[name] / 1e9:>12.1f}{parameters[name]:>14,}")
    print(f"time ratio {time_ratio:.2f}, FLOP ratio {flop_ratio:.2f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
