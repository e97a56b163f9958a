"""Peak memory per rank and step time of ``FSDPStrategy`` against ``DDPStrategy``: two ranks on the CPU, and one
GPU at world size 1 when CUDA is available.

    python benchmarks/bench_fsdp.py            # CPU: a 302 MB model, 3 rounds (about 10 minutes on 2 cores)
    python benchmarks/bench_fsdp.py --quick    # smoke run: a tiny model, 2 steps, one round (what the tests run)

The workload, the same for every variant: a residual MLP of 4 blocks (LayerNorm, Linear 1536 -> 6144, GELU,
Linear 6144 -> 1536), 75.5M parameters (302 MB in float32), trained with AdamW on batches of 16, the loop its
user would write:

* ``ddp``: ``Fabric(strategy="ddp", devices=2)``; the model built in each process, ``fabric.setup(model, optimizer)``.
* ``fsdp``: ``Fabric(strategy=FSDPStrategy(auto_wrap_policy={Block}), devices=2)``; the model created under
  ``fabric.init_module(empty_init=True)`` (on the meta device), ``setup_module`` (sharded, then each rank's shards
  materialised), then the optimizer from the sharded parameters and ``setup_optimizers``.
* ``raw_fsdp``: the same with torch alone (fabric_lite only starts the processes): the model on the meta device,
  ``fully_shard`` on every block and the root with torch's defaults, ``to_empty`` and ``reset_parameters``, AdamW,
  ``loss.backward()``. ``fsdp``/``raw_fsdp`` is what the strategy costs over sharding by hand.

Each variant runs in fresh processes (started by fabric_lite's own script launcher), the variants alternate round
after round, and every rank reports:

* ``peak RSS``: ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the process's resident-set high-water mark, at the
  end of the run, minus the resident set just before the model is built (imports and the process group are the same
  for both variants). It counts everything the process touched: parameters, gradients, optimizer state, activations,
  communication buffers, and transient copies.
* ``step``: the median wall time of the timed steps (after 2 warm-up steps), each between two barriers.

Step times of fresh processes differ from run to run by more than 2 % (the machine, not the code), so the CPU section
also times ``fsdp`` against ``raw_fsdp`` **paired**: both models built in the same two processes, trained in
alternating rounds of ``steps`` steps each (the order swapped every round, the ranks meeting in a barrier before each
timed block); the figure is the median of the per-round ratios, and the spread their interquartile range.

The GPU section (only with CUDA) trains the same model at world size 1 on one GPU, with ``ddp``, ``fsdp`` and
``fsdp`` with ``cpu_offload=True``, and reports ``torch.cuda.max_memory_allocated()`` and the step time: at world
size 1 nothing is sharded, so it shows FSDP's own overhead, and what CPU offload saves on the device.

Prints tables of the medians over rounds, rank by rank, and the FSDP/DDP ratios; ``--out`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _common import result_rows
from torch import nn

SIZES = {
    "full": {"width": 1536, "blocks": 4, "batch": 16, "steps": 6},
    "quick": {"width": 64, "blocks": 2, "batch": 4, "steps": 2},
}
WARMUP = 2


def _rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS: the memory figure needs Linux")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def make_model(width: int, blocks: int) -> nn.Module:
    return nn.Sequential(*[Block(width) for _ in range(blocks)])


def run_child(variant: str, size: str, device: str) -> None:
    """In each rank's process: build, set up and train through ``variant``; print this rank's figures."""
    from fabric_lite import Fabric
    from fabric_lite.strategies import FSDPStrategy

    torch.set_num_threads(1)
    config = SIZES[size]
    width, steps, batch = config["width"], config["steps"], config["batch"]
    devices = 1 if device == "cuda" else 2
    if variant in ("ddp", "raw_fsdp"):
        strategy: Any = "ddp"  # raw_fsdp: fabric_lite only starts the processes and forms the group
    else:
        strategy = FSDPStrategy(auto_wrap_policy={Block}, cpu_offload=variant == "fsdp_offload")
    fabric = Fabric(accelerator=device, devices=devices, strategy=strategy)
    fabric.launch()
    fabric.barrier()
    torch.manual_seed(0)
    rss_before = _rss_now()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    backward = fabric.backward
    if variant == "raw_fsdp":
        model, optimizer = _shard_by_hand(width, config["blocks"], fabric.device)
        backward = torch.Tensor.backward
    elif variant == "ddp":
        model = make_model(width, config["blocks"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer = fabric.setup(model, optimizer)
    else:
        with fabric.init_module(empty_init=True):
            model = make_model(width, config["blocks"])
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
    x = torch.randn(batch, width, device=fabric.device)
    y = torch.randn(batch, width, device=fabric.device)
    times = []
    for step in range(WARMUP + steps):
        fabric.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        fabric.barrier()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    result = {
        "variant": variant,
        "rank": fabric.global_rank,
        "rss_peak": peak_rss - rss_before,
        "step": statistics.median(times),
        "loss": loss.item(),
        "params": sum(p.numel() for p in model.parameters()),
    }
    if device == "cuda":
        result["cuda_peak"] = torch.cuda.max_memory_allocated()
    # one write() of less than PIPE_BUF bytes: the ranks share the pipe, and such a write is never interleaved
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())


def run_paired(size: str, rounds: int) -> None:
    """In each rank's process: the strategy's model and the hand-sharded one side by side, timed in paired rounds."""
    from fabric_lite import Fabric
    from fabric_lite.strategies import FSDPStrategy

    torch.set_num_threads(1)
    config = SIZES[size]
    width, steps, batch = config["width"], config["steps"], config["batch"]
    fabric = Fabric(accelerator="cpu", devices=2, strategy=FSDPStrategy(auto_wrap_policy={Block}))
    fabric.launch()
    torch.manual_seed(0)
    with fabric.init_module(empty_init=True):
        model = make_model(width, config["blocks"])
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
    raw_model, raw_optimizer = _shard_by_hand(width, config["blocks"], fabric.device)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)

    def fsdp_step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()

    def raw_step() -> None:
        loss = nn.functional.mse_loss(raw_model(x), y)
        raw_optimizer.zero_grad()
        loss.backward()
        raw_optimizer.step()

    variants = {"raw_fsdp": raw_step, "fsdp": fsdp_step}
    for step in (raw_step, fsdp_step) * WARMUP:
        step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            fabric.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                variants[name]()
            fabric.barrier()
            times[name].append((time.perf_counter() - start) / steps)
    result = {"rank": fabric.global_rank, "times": times}
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())


def _shard_by_hand(width: int, blocks: int, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """What ``fsdp`` does, written with torch alone: the model on the meta device, ``fully_shard`` on every block and
    then the root (torch's defaults, as FSDPStrategy's), the shards materialised and initialised, then AdamW."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = make_model(width, blocks)
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)):
            module.reset_parameters()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _run_child(args: list[str], what: str, timeout: float) -> list[dict[str, Any]]:
    """Run this script with ``--child`` ``args`` (it starts its ranks itself); every rank's ``RESULT`` row, by rank."""
    rows = result_rows([sys.executable, __file__, "--child", *args], what, timeout)
    return sorted(rows, key=lambda row: row["rank"])


def run_variant(variant: str, size: str, device: str) -> list[dict[str, Any]]:
    return _run_child([variant, "--size", size, "--device", device], f"{variant} on {device}", timeout=1200)


def measure(variants: list[str], size: str, device: str, rounds: int) -> dict[str, list[list[dict[str, Any]]]]:
    """``rounds`` rounds in which every variant runs once in fresh processes, alternating the order."""
    runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            runs[variant].append(run_variant(variant, size, device))
    return runs


def paired(size: str, rounds: int) -> list[dict[str, Any]]:
    """``fsdp`` against ``raw_fsdp`` in the same two processes (see the module docstring); prints the rows."""
    results = _run_child(["paired", "--size", size, "--rounds", str(rounds)], "the paired run", timeout=1800)
    print(f"\nfsdp against raw_fsdp in the same processes, {rounds} paired round(s):")
    print(f"{'figure':<22}{'rank':>5}{'raw_fsdp':>16}{'fsdp':>16}{'fsdp/raw_fsdp':>16}{'spread':>9}")
    rows = []
    for result in results:
        raw, mine = result["times"]["raw_fsdp"], result["times"]["fsdp"]
        ratios = [m / r for m, r in zip(mine, raw, strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        row = {"figure": "step", "rank": result["rank"], "raw": statistics.median(raw), "fsdp": statistics.median(mine)}
        row.update(ratio=statistics.median(ratios), spread=q[2] - q[0])
        rows.append(row)
        print(
            f"{'step':<22}{row['rank']:>5}{_fmt(row['raw'], 's'):>16}{_fmt(row['fsdp'], 's'):>16}"
            f"{row['ratio']:>15.3f}x{row['spread']:>9.3f}"
        )
    return rows


def _fmt(value: float, unit: str) -> str:
    return f"{value / 1e6:.1f} MB" if unit == "bytes" else f"{value * 1e3:.1f} ms"


def table(
    runs: dict[str, list[list[dict[str, Any]]]], figures: list[tuple[str, str]], base: str = "ddp"
) -> list[dict[str, Any]]:
    """Medians over rounds per rank and figure, each variant against ``base``; prints them and returns the rows."""
    variants = [base] + [v for v in runs if v != base]
    ranks = len(runs[base][0])
    rows = []
    header = f"{'figure':<22}{'rank':>5}" + "".join(f"{v:>16}" for v in variants)
    print(header + "".join(f"{v + '/' + base:>22}" for v in variants[1:]))
    for key, unit in figures:
        for rank in range(ranks):
            medians = {v: statistics.median(run[rank][key] for run in runs[v]) for v in variants}
            ratios = {v: medians[v] / medians[base] for v in variants[1:]}
            rows.append({"figure": key, "unit": unit, "rank": rank, "medians": medians, "ratios": ratios})
            line = f"{key:<22}{rank:>5}" + "".join(f"{_fmt(medians[v], unit):>16}" for v in variants)
            print(line + "".join(f"{ratios[v]:>21.3f}x" for v in variants[1:]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 steps, one round")
    parser.add_argument("--out", help="also write the tables as JSON to this file")
    parser.add_argument("--rounds", type=int, help="rounds of fresh processes per variant (default 3; 1 with --quick)")
    parser.add_argument(
        "--section",
        choices=["all", "cpu", "paired", "gpu"],
        default="all",
        help="run only the CPU section, only its paired step times, or only the GPU section",
    )
    parser.add_argument(
        "--paired-rounds", type=int, default=10, help="paired rounds of fsdp against raw_fsdp (default 10)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(SIZES), default="full", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "paired":
        run_paired(args.size, args.rounds)
        return
    if args.child:
        run_child(args.child, args.size, args.device)
        return
    size, rounds = ("quick", 1) if args.quick else ("full", 3)
    rounds = args.rounds or rounds
    config = SIZES[size]
    record: dict[str, Any] = {"torch": torch.__version__, "size": config, "quick": args.quick}
    blocks = f"{config['blocks']} blocks of width {config['width']}, AdamW, batch {config['batch']}"
    if args.section == "paired":
        record["cpu_paired"] = paired(size, 1 if args.quick else args.paired_rounds)
    if args.section in ("all", "cpu"):
        print(f"CPU, 2 ranks, gloo: {blocks}")
        cpu_runs = measure(["ddp", "fsdp", "raw_fsdp"], size, "cpu", rounds)
        params = cpu_runs["ddp"][0][0]["params"]
        print(f"{params / 1e6:.1f}M parameters ({params * 4 / 1e6:.0f} MB in float32), medians of {rounds} round(s)")
        figures = [("rss_peak", "bytes"), ("step", "s")]
        record["cpu"] = table({v: cpu_runs[v] for v in ("ddp", "fsdp")}, figures)
        print("\nfsdp against the same model sharded by hand with fully_shard (raw_fsdp):")
        record["cpu_raw"] = table({v: cpu_runs[v] for v in ("raw_fsdp", "fsdp")}, figures, base="raw_fsdp")
        record["cpu_runs"] = cpu_runs
        record["cpu_paired"] = paired(size, 1 if args.quick else args.paired_rounds)
    if args.section in ("cpu", "paired"):
        pass
    elif torch.cuda.is_available():
        print(f"\n{torch.cuda.get_device_name(0)}, world size 1: {blocks}, medians of {rounds} round(s)")
        gpu_runs = measure(["ddp", "fsdp", "fsdp_offload", "raw_fsdp"], size, "cuda", rounds)
        figures = [("cuda_peak", "bytes"), ("rss_peak", "bytes"), ("step", "s")]
        record["gpu"] = table({v: gpu_runs[v] for v in ("ddp", "fsdp", "fsdp_offload")}, figures)
        print("\nfsdp against the same model sharded by hand with fully_shard (raw_fsdp), on the GPU:")
        record["gpu_raw"] = table({v: gpu_runs[v] for v in ("raw_fsdp", "fsdp")}, figures, base="raw_fsdp")
        record["gpu_runs"] = gpu_runs
    else:
        print("\nGPU section skipped: CUDA is not available on this machine")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
