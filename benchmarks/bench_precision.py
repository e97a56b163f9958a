"""Step time per precision: fabric_lite against the same loop written by hand in raw PyTorch.

    python benchmarks/bench_precision.py [--device cpu|cuda] [--quick]

For each precision the raw loop is what one writes without fabric_lite: ``torch.autocast`` (and, for float16,
``torch.amp.GradScaler``) for the mixed precisions, ``.half()``/``.bfloat16()``/``.double()`` for the true ones.
The two run in paired, interleaved rounds on identical model copies; CUDA work is synchronised before each clock
read. On the CPU, ``"16-mixed"`` is run through ``MixedPrecision("16-mixed", "cpu")`` (the string would mean
bf16 there, as in Lightning). Prints a table and one ``RESULT {json}`` line per precision.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins.precision import MixedPrecision

PRECISIONS = ["32-true", "64-true", "bf16-mixed", "16-mixed", "16-true", "bf16-true"]
HALF = {"16-true": torch.float16, "bf16-true": torch.bfloat16, "64-true": torch.float64}


def model_for(device: str) -> nn.Module:
    width = 1024 if device == "cuda" else 256
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 8))


def raw_step(precision: str, device: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    if precision in HALF:
        model.to(HALF[precision])
        x = x.to(HALF[precision])

        def step() -> None:
            loss = nn.functional.mse_loss(model(x).float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        return step
    if precision.endswith("mixed"):
        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
        scaler = torch.amp.GradScaler(device) if precision == "16-mixed" else None

        def step() -> None:
            with torch.autocast(device, dtype=dtype):
                out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
            optimizer.zero_grad()
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()

        return step

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def fabric_step(precision: str, device: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    if precision == "16-mixed" and device == "cpu":
        fabric = Fabric(accelerator=device, devices=1, plugins=[MixedPrecision("16-mixed", "cpu")])
    else:
        fabric = Fabric(accelerator=device, devices=1, precision=precision)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=1e-4))

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()

    return step


def timed(fn: Callable[[], None], steps: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = args.device
    rounds, steps = (3, 5) if args.quick else (11, 50)
    if device == "cpu":
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores, 1 thread)"
    print(f"device: {name}, torch {torch.__version__}")
    print(f"{'precision':<12}{'fabric_lite':>14}{'raw PyTorch':>14}{'ratio':>9}{'spread':>9}")
    for precision in PRECISIONS:
        torch.manual_seed(0)
        base = model_for(device).to(device)
        copy = model_for(device).to(device)
        copy.load_state_dict(base.state_dict())
        width = base[0].in_features
        x = torch.randn(256 if device == "cuda" else 64, width, device=device)
        y = torch.randn(x.shape[0], 8, device=device)
        variants = {
            "raw": raw_step(precision, device, base, x, y),
            "fabric_lite": fabric_step(precision, device, copy, x, y),
        }
        for fn in variants.values():
            timed(fn, max(3, steps // 5), device)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(rounds):
            for key in variants if r % 2 == 0 else list(variants)[::-1]:
                times[key].append(timed(variants[key], steps, device))
        ratios = [f / r for f, r in zip(times["fabric_lite"], times["raw"], strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(
            f"{precision:<12}{statistics.median(times['fabric_lite']) * 1e3:>11.3f} ms"
            f"{statistics.median(times['raw']) * 1e3:>11.3f} ms{statistics.median(ratios):>8.3f}x{q[2] - q[0]:>9.3f}"
        )
        os.write(1, ("RESULT " + json.dumps({"precision": precision, "device": name, "times": times}) + "\n").encode())


if __name__ == "__main__":
    main()
