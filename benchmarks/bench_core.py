"""Measurements run inside one interpreter: ``python benchmarks/bench_core.py MEASURE IMPL [--quick]``.

Every measurement pairs the implementation with raw PyTorch in the same process, in interleaved rounds, so that
machine noise hits both alike; it prints one ``RESULT {json}`` line per rank with the per-round times. In the
two-process measurements the ranks meet in a ``barrier`` right before every timed block: ranks that drift apart
time each other's stragglers instead of the code (without it the figures swung by ±30 %).

MEASURE is ``step`` (single-process training step), ``ddp`` (two-process DDP step and collectives; start it
with ``torch.distributed.run --nproc-per-node 2``). IMPL is ``fabric_lite``, ``lightning`` or ``accelerate``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

MODELS = {
    "tiny": lambda: nn.Linear(32, 32),
    "mlp": lambda: nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)),
}
INPUT = {"tiny": 32, "mlp": 256}
BATCH = 64
ROUND_SECONDS = 0.25  # the longest a round of one collective variant should last


def emit(payload: dict) -> None:
    os.write(1, ("RESULT " + json.dumps(payload) + "\n").encode())


def timed_rounds(
    variants: dict[str, Callable[[], object]], rounds: int, steps: int, sync: Callable[[], object] | None = None
) -> dict[str, list[float]]:
    """Per-step seconds for each variant, ``rounds`` times, the variants taking turns (paired rounds).

    ``sync`` runs, untimed, right before every timed block (``dist.barrier`` for the multi-process measurements).
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        for _ in range(max(3, steps // 5)):
            fn()
    for r in range(rounds):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            if sync is not None:
                sync()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - start) / steps)
    return times


def make_impl(impl: str, devices: int = 1, strategy: str = "auto"):
    if impl == "fabric_lite":
        from fabric_lite import Fabric

        return Fabric(accelerator="cpu", devices=devices, strategy=strategy)
    if impl == "lightning":
        from lightning_fabric import Fabric

        return Fabric(accelerator="cpu", devices=devices, strategy=strategy)
    if impl == "accelerate":
        from accelerate import Accelerator

        return Accelerator(cpu=True)
    raise ValueError(impl)


def step_functions(impl: str, model_name: str) -> dict[str, Callable[[], None]]:
    """A raw PyTorch step and the same step through ``impl``, on identical copies of the model and data."""
    torch.manual_seed(0)
    raw_model = MODELS[model_name]()
    wrapped_model = MODELS[model_name]()
    wrapped_model.load_state_dict(raw_model.state_dict())
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    opt = torch.optim.SGD(wrapped_model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, INPUT[model_name])
    y = torch.randn(BATCH, raw_model(x).shape[-1])
    loss_fn = nn.functional.mse_loss

    def raw() -> None:
        loss = loss_fn(raw_model(x), y)
        raw_opt.zero_grad()
        loss.backward()
        raw_opt.step()

    accel = make_impl(impl)
    if impl == "accelerate":
        model, optimizer = accel.prepare(wrapped_model, opt)

        def wrapped() -> None:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            accel.backward(loss)
            optimizer.step()
    else:
        model, optimizer = accel.setup(wrapped_model, opt)

        def wrapped() -> None:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            accel.backward(loss)
            optimizer.step()

    return {"raw": raw, impl: wrapped}


def measure_step(impl: str, rounds: int, steps: int) -> None:
    torch.set_num_threads(1)
    for model_name in MODELS:
        times = timed_rounds(step_functions(impl, model_name), rounds, steps)
        emit({"measure": f"step/{model_name}", "impl": impl, "times": times})


def calls_per_round(variants: list[Callable[[], object]], limit: int) -> int:
    """``limit`` calls a round, or fewer (at least 5) for a collective whose slower variant would make a round last
    longer than ``ROUND_SECONDS`` (Lightning Fabric's dict all_reduce takes ~50 ms a call). Every rank must call it;
    every rank gets the same answer."""
    import torch.distributed as dist

    slowest = 0.0
    for fn in variants:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(3):
            fn()
        slowest = max(slowest, (time.perf_counter() - start) / 3)
    agreed = torch.tensor(slowest, dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return max(5, min(limit, int(ROUND_SECONDS / agreed.item())))


def measure_ddp(impl: str, rounds: int, steps: int, coll_rounds: int, coll_calls: int) -> None:
    """Under torchrun: a DDP step through ``impl`` against raw DistributedDataParallel, and collectives."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    if impl == "accelerate":
        raise SystemExit("accelerate is compared single-process only")
    accel = make_impl(impl, devices=int(os.environ["WORLD_SIZE"]), strategy="ddp")
    accel.launch()
    rank = dist.get_rank()
    for model_name in MODELS:
        torch.manual_seed(0)
        raw_model = DistributedDataParallel(MODELS[model_name]())
        raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
        plain = MODELS[model_name]()
        model, optimizer = accel.setup(plain, torch.optim.SGD(plain.parameters(), lr=1e-3))
        x = torch.randn(BATCH, INPUT[model_name])
        y = torch.randn(BATCH, INPUT[model_name] if model_name == "mlp" else 32)

        def raw() -> None:
            loss = nn.functional.mse_loss(raw_model(x), y)
            raw_opt.zero_grad()
            loss.backward()
            raw_opt.step()

        def wrapped() -> None:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accel.backward(loss)
            optimizer.step()

        times = timed_rounds({"raw": raw, impl: wrapped}, rounds, steps, sync=dist.barrier)
        emit({"measure": f"ddp_step/{model_name}", "impl": impl, "rank": rank, "times": times})

    world = dist.get_world_size()
    _all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scalars = {f"m{i}": torch.tensor(float(i + rank)) for i in range(64)}
    flat = torch.arange(64, dtype=torch.float32)
    one = torch.tensor(1.0)
    one_1d = one.reshape(1)  # raw gloo gathers 1-D tensors only
    collectives: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        # a dict of 64 scalars through the implementation, against one flat all_reduce of the same 64 values
        "all_reduce/dict64": (lambda: dist.all_reduce(flat), lambda: accel.all_reduce(scalars, reduce_op="sum")),
        "all_reduce/scalar": (lambda: dist.all_reduce(one), lambda: accel.all_reduce(one, reduce_op="sum")),
        # a gather of one scalar into a new (world_size,) tensor
        "all_gather/scalar": (
            lambda: _all_gather_single(torch.empty(world), one_1d, group=None),
            lambda: accel.all_gather(one),
        ),
    }
    for name, numel in (("tensor1k", 1024), ("tensor4M", 1 << 20)):  # 1M floats are 4 MB
        tensor = torch.arange(numel, dtype=torch.float32)
        collectives[f"broadcast/{name}"] = (
            partial(dist.broadcast, tensor, src=0),
            partial(accel.broadcast, tensor, src=0),
        )
    for measure, (raw_call, impl_call) in collectives.items():
        calls = calls_per_round([raw_call, impl_call], coll_calls)
        times = timed_rounds({"raw": raw_call, impl: impl_call}, coll_rounds, calls, sync=dist.barrier)
        emit({"measure": measure, "impl": impl, "rank": rank, "calls": calls, "times": times})
    # Leave together, and give gloo's worker threads a moment to release their last work objects: a thread still
    # holding one when the interpreter finalises aborts the process ("terminate called without an active
    # exception"), which happened to Lightning Fabric's run here, whose process group is never destroyed.
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("measure", choices=["step", "ddp"])
    parser.add_argument("impl", choices=["fabric_lite", "lightning", "accelerate"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    # (rounds, steps per round) for training steps; (rounds, calls per round) for collectives
    rounds, steps = (3, 20) if args.quick else (15, 200)
    coll_rounds, coll_calls = (3, 5) if args.quick else (30, 100)
    if args.measure == "step":
        measure_step(args.impl, rounds, steps)
    else:
        measure_ddp(args.impl, rounds, steps, coll_rounds, coll_calls)


if __name__ == "__main__":
    main()
