"""Peak memory of training: raw PyTorch against fabric_lite, Lightning Fabric and Accelerate, on the CPU.

    python benchmarks/bench_memory.py [--quick]

The workload, identical for every variant: a ~34M-parameter MLP (2048 -> 4096 -> 4096 -> 2048, 134 MB of float32
parameters) trained for 5 steps with SGD with momentum, batches of 64 drawn from a ``DataLoader``. Each
implementation does what its user would write: ``setup`` (``prepare`` for Accelerate) the model, the optimizer and
the loader, and ``backward`` through it. Each run is a fresh process, so that nothing allocated by an earlier
variant, and no allocator cache, is counted; the variants take turns, round after round.

Two figures, both the peak *growth* over the memory in use just before the model is built, up to the end of the
last step (so an extra copy made by ``setup`` counts as well as one made in a step):

* ``memory/tensor_peak``: the peak of the bytes held by live tensors. ``torch.profiler.profile(profile_memory=True)``
  records every allocation and release of the CPU allocator, with its size and time, without changing which
  operators run; the running sum of those records, in time order, peaks at the answer. It is exact and does not
  depend on the C library's allocator: an extra copy of the parameters, gradients or a batch shows up as its size.
  The figure to hold against raw PyTorch: equal means no extra copy.
* ``memory/rss_peak``: the peak resident set size, from ``/proc/self/status`` (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before the model is built). It also counts what is not a tensor (Python objects,
  library buffers) and depends on the allocator, so it is the coarser cross-check. ``MALLOC_MMAP_THRESHOLD_`` is
  fixed so that glibc returns large blocks to the system when they are freed, instead of keeping them around.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from _common import child_env, compared_impls, print_table, python_for, result_rows, summarise

WIDTHS = {"full": (2048, 4096, 4096, 2048), "quick": (256, 512, 512, 256)}
BATCH = 64


def _proc_status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {key}: the RSS figure needs Linux")


def _peak_of_records(records: list[tuple[int, int]]) -> int:
    """The largest running sum of (time, bytes) allocation records (releases are negative), in time order."""
    running = peak = 0
    for _, nbytes in sorted(records):
        running += nbytes
        peak = max(peak, running)
    return peak


def _warm_up_kernels() -> None:
    """Run every kernel of the workload once on a tiny model: the first call of a kernel pages in its code and sets
    up library buffers, which would otherwise count in the RSS figure, less in a variant that imports more of torch.
    Everything it allocates is released on return, before the profiler starts."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    for x, y in DataLoader(TensorDataset(torch.randn(4, 8), torch.randn(4, 8)), batch_size=2):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def run_once(impl: str, size: str, steps: int) -> dict[str, int]:
    """In this (fresh) process: train ``steps`` steps through ``impl`` and return the peak growths in bytes."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    widths = WIDTHS[size]
    data = TensorDataset(torch.randn(steps * BATCH, widths[0]), torch.randn(steps * BATCH, widths[-1]))
    accel: Any = None
    if impl == "fabric_lite":
        from fabric_lite import Fabric

        accel = Fabric(accelerator="cpu", devices=1)
    elif impl == "lightning":
        from lightning_fabric import Fabric

        accel = Fabric(accelerator="cpu", devices=1)
    elif impl == "accelerate":
        from accelerate import Accelerator

        accel = Accelerator(cpu=True)
    elif impl != "raw":
        raise ValueError(f"no memory variant for {impl!r}: choose raw, fabric_lite, lightning or accelerate")

    _warm_up_kernels()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    rss_before = _proc_status("VmRSS")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layers: list[nn.Module] = []
        for n_in, n_out in itertools.pairwise(widths):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        loader = DataLoader(data, batch_size=BATCH)
        backward = torch.Tensor.backward
        if impl == "accelerate":
            model, optimizer, loader = accel.prepare(model, optimizer, loader)
            backward = accel.backward
        elif accel is not None:
            model, optimizer = accel.setup(model, optimizer)
            loader = accel.setup_dataloaders(loader)
            backward = accel.backward
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            backward(loss)
            optimizer.step()
    rss_peak = _proc_status("VmHWM") - rss_before
    # the profiler's own record of each allocation ("[memory]" events: + on allocation, - on release)
    records = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    if not records:
        raise RuntimeError("torch.profiler recorded no allocation: this torch cannot report tensor memory")
    return {"tensor_peak": _peak_of_records(records), "rss_peak": rss_peak}


def measure(impls: list[str], rounds: int, size: str, steps: int) -> list[dict]:
    """``rounds`` rounds in which raw PyTorch and every implementation take a fresh process each."""
    variants = ["raw", *impls]
    peaks: dict[str, dict[str, list[float]]] = {"tensor_peak": {}, "rss_peak": {}}
    for r in range(rounds):
        for name in variants if r % 2 == 0 else variants[::-1]:
            env = child_env()
            env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # a fixed threshold: large blocks go back when freed
            argv = [python_for(name), __file__, "--child", name, "--size", size, "--steps", str(steps)]
            for key, value in result_rows(argv, f"memory run of {name}", 600, env=env)[-1].items():  # type: ignore[arg-type]
                peaks[key].setdefault(name, []).append(value)
    return [
        {"measure": f"memory/{key}", "impl": impl, "unit": "bytes", "times": {"raw": by["raw"], impl: by[impl]}}
        for key, by in peaks.items()
        for impl in impls
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small model, 2 steps, one round")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(WIDTHS), default="full", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run_once(args.child, args.size, args.steps)), flush=True)
        return
    rounds, size, steps = (1, "quick", 2) if args.quick else (3, "full", 5)
    print_table(summarise(measure(compared_impls(), rounds, size, steps)))


if __name__ == "__main__":
    main()
