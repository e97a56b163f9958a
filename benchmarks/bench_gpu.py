"""A small GPT in bf16-mixed on one GPU: step time and peak memory, raw PyTorch against fabric_lite, Lightning Fabric
and Accelerate, on one device and under DDP at world size 1.

    python benchmarks/bench_gpu.py                          # on a CUDA machine (about 5 minutes)
    python benchmarks/bench_gpu.py --device cpu --quick     # smoke run anywhere (tiny model, gloo for DDP)

The model: a GPT-style decoder (token and position embeddings, pre-LayerNorm blocks of causal self-attention through
``scaled_dot_product_attention`` and a GELU MLP, an untied LM head): 6 layers, d_model 768, 12 heads, sequence 512,
batch 8, vocabulary 16384, about 68M parameters; trained with AdamW on a fixed random batch in bf16-mixed. Every
variant writes the loop its user would write:

* ``raw``: ``torch.autocast(device, dtype=torch.bfloat16)`` around the forward, by hand.
* ``fabric_lite`` / ``lightning``: ``Fabric(accelerator=device, devices=1, precision="bf16-mixed")``, ``setup``,
  ``fabric.backward``.
* ``accelerate``: ``Accelerator(mixed_precision="bf16")``, ``prepare``, ``accelerator.backward``.
* ``raw`` and ``fabric_lite`` under DDP: the same, started by ``python -m torch.distributed.run --standalone
  --nproc-per-node 1`` and joined over NCCL (gloo on the CPU): ``DistributedDataParallel`` by hand, and
  ``Fabric(strategy="ddp")``. fabric_lite's DDP figure is compared with raw DDP.

Lightning Fabric and Accelerate are measured when this interpreter can import them, and skipped with a note when
not. Every variant runs in a process of its own, so that the peaks of memory do not mix: the peak is
``torch.cuda.max_memory_allocated()`` over the whole run (model, optimizer state, activations; DDP's gradient
buckets under DDP), after ``torch.cuda.reset_peak_memory_stats()``; on the CPU it is not measured. Step time is
taken after warm-up steps, between two ``torch.cuda.synchronize()``. The rounds are paired: in every round each
variant runs once, in alternating order, and each ratio is that round's time over its baseline's time in the same
round; the table shows the median over rounds. Prints a table with the device name and writes JSON (``--out``) and
a chart of the ratios next to it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _chart import write_chart
from _common import REPO, format_value, leave_process_group, result_rows, summarise
from torch import nn


@dataclass(frozen=True)
class Config:
    layers: int = 6
    d_model: int = 768
    heads: int = 12
    seq: int = 512
    batch: int = 8
    vocab: int = 16384

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of heads={self.heads}")


SIZES = {"gpt": Config(), "tiny": Config(layers=2, d_model=64, heads=4, seq=32, batch=2, vocab=256)}
#: variant -> (the baseline its ratios are taken against, whether it runs under torchrun, the module it needs)
VARIANTS: dict[str, tuple[str, bool, str | None]] = {
    "raw": ("raw", False, None),
    "fabric_lite": ("raw", False, "fabric_lite"),
    "lightning": ("raw", False, "lightning_fabric"),
    "accelerate": ("raw", False, "accelerate"),
    "raw_ddp": ("raw_ddp", True, None),
    "fabric_lite_ddp": ("raw_ddp", True, "fabric_lite"),
}


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.heads = config.heads
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.out = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.out(F.gelu(self.fc(self.ln_mlp(x))))


class GPT(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.d_model)
        self.positions = nn.Embedding(config.seq, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_final(x))


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def run_variant(variant: str, device_type: str, config: Config, warmup: int, steps: int) -> dict[str, Any]:
    """In this (fresh) process: build the model, train ``warmup`` then ``steps`` timed steps through ``variant``."""
    cuda = device_type == "cuda"
    ddp = VARIANTS[variant][1]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(config.vocab, (config.batch, config.seq + 1), generator=generator).to(device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    accel: Any = None

    if variant in ("raw", "raw_ddp"):
        if ddp:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            backend = "nccl" if cuda else "gloo"
            dist.init_process_group(backend, device_id=device if cuda else None)
            model = DistributedDataParallel(model.to(device), device_ids=[local_rank] if cuda else None)
        else:
            model.to(device)

        def step() -> torch.Tensor:
            with torch.autocast(device_type, dtype=torch.bfloat16):
                logits = model(x)
            loss = _loss(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

    else:
        if variant == "accelerate":
            from accelerate import Accelerator

            accel = Accelerator(mixed_precision="bf16", cpu=not cuda)
            model, optimizer = accel.prepare(model, optimizer)
        else:
            if variant == "lightning":
                from lightning_fabric import Fabric
            else:
                from fabric_lite import Fabric
            accel = Fabric(
                accelerator=device_type, devices=1, strategy="ddp" if ddp else "auto", precision="bf16-mixed"
            )
            accel.launch()
            model, optimizer = accel.setup(model, optimizer)

        def step() -> torch.Tensor:
            loss = _loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            accel.backward(loss)
            optimizer.step()
            return loss

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if cuda:
        torch.cuda.synchronize()  # the clock stops when the GPU has finished, not when the last kernel was queued
    seconds = (time.perf_counter() - start) / steps
    result = {
        "step_s": seconds,
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "loss": loss.item(),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return result


def available_variants() -> tuple[list[str], list[str]]:
    """The variants this interpreter can run, and a note for each one it cannot."""
    found, notes = [], []
    for name, (_, _, module) in VARIANTS.items():
        if module is None or module == "fabric_lite" or importlib.util.find_spec(module) is not None:
            found.append(name)
        else:
            notes.append(f"note: {name} skipped: `import {module}` fails in {sys.executable}")
    return found, notes


def _run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [__file__, "--child", variant, "--device", args.device, "--size", args.size]
    command += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    if VARIANTS[variant][1]:
        command = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *command]
    # a quick child takes 10-40 s: its bound names the variant that hangs, well inside the smoke test's own
    return result_rows([sys.executable, *command], variant, timeout=120 if args.quick else 900)[-1]


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per variant, the table line of its step time (``"gpu_step"``) and of its peak memory (``"gpu_memory"``, on
    CUDA), with the ratios to its baseline's value in the same round."""
    lines: dict[str, dict[str, dict[str, Any]]] = {}
    for name, runs in results.items():
        baseline, ddp, _ = VARIANTS[name]
        impl = name.removesuffix("_ddp")
        lines[name] = {}
        for key, measure, unit in (("step_s", "gpu_step", "s"), ("peak_bytes", "gpu_memory", "bytes")):
            mine, theirs = [run[key] for run in runs], [run[key] for run in results[baseline]]
            if None in mine:
                continue
            row = {"measure": f"{measure}/{'ddp_ws1' if ddp else '1_device'}", "impl": impl, "unit": unit}
            lines[name][measure] = summarise([{**row, "times": {"raw": theirs, impl: mine}}])[0]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="one round of a few steps: a smoke run")
    parser.add_argument("--size", choices=sorted(SIZES), help="the model: gpt (default on CUDA) or tiny (on the CPU)")
    parser.add_argument("--rounds", type=int, help="paired rounds (default 5, 1 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 5, 1 with --quick)")
    parser.add_argument("--steps", type=int, help="timed steps per round (default 20, 2 with --quick)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "gpu.json"), help="the JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu for a smoke run")
    args.size = args.size or ("gpt" if args.device == "cuda" else "tiny")
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    args.steps = args.steps or (2 if args.quick else 20)
    config = SIZES[args.size]
    if args.child:
        result = run_variant(args.child, args.device, config, args.warmup, args.steps)
        # the models are gone now (run_variant has returned; cycles collected): raw DDP ends its process group as
        # leave_process_group says, and fabric_lite and Lightning Fabric end theirs at exit, as a user's script would
        if args.child == "raw_ddp":
            leave_process_group()  # collects the cycles itself
        else:
            gc.collect()
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    variants, notes = available_variants()
    for note in notes:
        print(note)
    print(f"device: {device_name}, torch {torch.__version__}, {config}, bf16-mixed, AdamW")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    order = [name for r in range(args.rounds) for name in (variants if r % 2 == 0 else variants[::-1])]
    # A quick run asserts nothing about speed, so two variants at a time keep it short; a full run never overlaps two.
    with ThreadPoolExecutor(max_workers=2 if args.quick else 1) as pool:
        for name, result in zip(order, pool.map(partial(_run_child, args=args), order), strict=True):
            results[name].append(result)

    lines = summary(results)
    print(f"{'variant':<18}{'step time':>12}{'ratio':>9}{'spread':>9}{'peak memory':>14}{'ratio':>9}{'loss':>9}")
    for name in variants:
        step, memory = lines[name]["gpu_step"], lines[name].get("gpu_memory")
        base = "" if VARIANTS[name][0] != name else " (base)"
        print(
            f"{name + base:<18}{format_value(step['median'], 's'):>12}{step['ratio']:>8.3f}x{step['spread']:>9.3f}"
            + (f"{format_value(memory['median'], 'bytes'):>14}{memory['ratio']:>8.3f}x" if memory else f"{'n/a':>14}")
            + f"{results[name][-1]['loss']:>9.4f}"
        )
    # the chart and the JSON's "results" hold the comparisons, not the baselines against themselves
    table = [line for name in variants if VARIANTS[name][0] != name for line in lines[name].values()]

    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device_name,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "torch": torch.__version__,
        "config": asdict(config),
        "precision": "bf16-mixed",
        "quick": args.quick,
        "rounds": args.rounds,
        "steps": args.steps,
        "notes": notes,
        "variants": results,
        "results": table,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    message = f"written to {out}"
    if table:
        millions = results[variants[0]][0]["parameters"] / 1e6
        title = f"A {millions:.1f}M-parameter GPT in bf16-mixed against raw PyTorch"
        subtitle = [f"{device_name}, torch {torch.__version__}, {record['date']}"]
        write_chart(out.with_suffix(".png"), table, title, subtitle)
        message += f" and {out.with_suffix('.png')}"
    print(message)


if __name__ == "__main__":
    main()
