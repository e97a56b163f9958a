"""Measurements run inside one interpreter: ``python benchmarks/bench_core.py MEASURE IMPL [--quick]``.

Every measurement pairs the implementation with raw PyTorch in the same process, in interleaved rounds, so that
machine noise hits both alike; it prints one ``RESULT {json}`` line per rank with the per-round times. In the
two-process measurements the ranks meet in a ``barrier`` right before every timed block: ranks that drift apart
time each other's stragglers instead of the code (without it the figures swung by ±30 %).

MEASURE is ``step`` (single-process training step), ``ddp`` (two-process DDP step and collectives, with the
payload sweep of ``all_reduce`` from 4 B to 64 MiB and, for fabric_lite, every reduce op and dtype group; start it
with ``torch.distributed.run --nproc-per-node 2``) or ``sweep`` (the payload sweep alone, on any number of ranks).
IMPL is ``fabric_lite``, ``lightning`` or ``accelerate``. ``--only ops/int64,sweep/1MiB`` measures only the figures
whose names start with one of the given prefixes (a targeted run; ``benchmarks/run.py`` measures everything);
``--pin`` keeps each rank on a core of its own where there are as many cores as ranks; ``--rounds N`` sets the rounds
of each collective (30 by default).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from _common import leave_process_group
from torch import nn

MODELS = {
    "tiny": lambda: nn.Linear(32, 32),
    "mlp": lambda: nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)),
}
INPUT = {"tiny": 32, "mlp": 256}
BATCH = 64
ROUND_SECONDS = 0.25  # the longest a round of one collective variant should last
#: ``--only``: name prefixes of the figures to measure (all when empty)
ONLY: list[str] = []
#: ``--pin``: each rank on a core of its own (see :func:`pin_to_own_core`)
PIN = False


def wanted(measure: str) -> bool:
    return not ONLY or any(measure.startswith(prefix) for prefix in ONLY)


def busy(seconds: float) -> None:
    """Keep the host busy for ``seconds`` (a control's stand-in for a wrapper's host work; sleeping would yield)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def pin_to_own_core() -> None:
    """``--pin``: keep this rank, and the gloo threads it starts, on a core of its own when there are enough cores.

    Two ranks left to the scheduler on two cores trade cores with each other's gloo threads, and small collectives
    swing by 30 % from round to round; pinned, by less. But pinning is another regime, not the same one with less
    noise: a rank's gloo threads then share its core, which made a raw 16 MiB all-reduce 25 % slower here and a
    second collective beside it costlier. Raw PyTorch and the implementation run in the same pinned processes, so
    the ratios stay fair; ``benchmarks/run.py`` does not pin."""
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cores = sorted(os.sched_getaffinity(0))
    if world <= len(cores):
        os.sched_setaffinity(0, {cores[local]})


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
    if PIN:
        pin_to_own_core()
    accel = make_impl(impl, devices=int(os.environ["WORLD_SIZE"]), strategy="ddp")
    accel.launch()
    rank = dist.get_rank()
    for model_name in [name for name in MODELS if wanted(f"ddp_step/{name}")]:
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
    # zeros: the calls reduce in place, round after round, and repeated sums of anything else overflow to inf within
    # a few hundred calls (a value that is not finite makes fabric_lite's predicted call check again; see RESULTS.md)
    scalars = {f"m{i}": torch.tensor(0.0) for i in range(64)}
    flat = torch.arange(64, dtype=torch.float32)
    one = torch.tensor(0.0)
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
    # 64 tensors of 8 floats (2 KiB): against one flat all_reduce, the cat and the split back included
    metrics = {f"m{i}": torch.zeros(8) for i in range(64)}
    values = list(metrics.values())

    def raw_dict() -> None:
        buffer = torch.cat(values)
        dist.all_reduce(buffer)
        torch._foreach_copy_(values, list(buffer.split(8)))

    collectives["all_reduce/dict64x8"] = (raw_dict, lambda: accel.all_reduce(metrics, reduce_op="sum"))
    # the floor of any wrapper on this machine: raw calls with 40 us of host time between them (what a checked call's
    # Python costs), against raw calls back to back (see RESULTS.md: a rank that arrives late wakes a waiting one)
    control = torch.zeros(1 << 18)

    def late() -> None:
        dist.all_reduce(control)
        busy(40e-6)

    # the same for a small broadcast, with 12 us of host time: about what fabric_lite's predicted broadcast cost the
    # host when this control was added (14 us on the source, 10 us on a receiver; since then 4 us and 8.6 us,
    # measured with the backend call stubbed out)
    small = torch.arange(1024, dtype=torch.float32)

    def late_broadcast() -> None:
        busy(12e-6)
        dist.broadcast(small, src=0)

    # and for an integer sum: raw with a one-element all-reduce beside it, what the flag of a predicted integer sum
    # costs (an integer has no value that absorbs the others, so whether every rank sent real data travels apart)
    integers = torch.zeros(1 << 19, dtype=torch.int64)  # 4 MiB

    def with_flag() -> None:
        work = dist.all_reduce(integers, async_op=True)
        dist.all_reduce(torch.ones(1, dtype=torch.int64))
        work.wait()

    if impl == "fabric_lite":  # measured once, in fabric_lite's run
        collectives["control/int4MiB_plus_flag"] = (partial(dist.all_reduce, integers), with_flag)
        collectives["control/1MiB_plus_40us"] = (partial(dist.all_reduce, control), late)
        collectives["control/bcast1k_plus_12us"] = (partial(dist.broadcast, small, src=0), late_broadcast)
    collectives.update(sweep(accel, quick=coll_calls < 10, ops=impl == "fabric_lite"))
    _measure_collectives(impl, rank, collectives, coll_rounds, coll_calls)


#: the payload sweep: float32 tensors of these many bytes, summed (``--quick``: up to 64 KiB)
SWEEP_BYTES = [4, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
#: every reduce op and dtype group, at a small and a large payload
OP_BYTES = [1 << 10, 1 << 20]
OPS = ["sum", "mean", "max", "min", "product"]
DTYPES = ["float32", "float64", "bfloat16", "int64", "bool"]


def _size_name(nbytes: int) -> str:
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB" if nbytes >= 1 << 10 else f"{nbytes}B"


def sweep(
    accel: Any, quick: bool, prefix: str = "sweep", ops: bool = True
) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """``all_reduce`` of one tensor through the implementation against ``dist.all_reduce`` of it: float32 sums of
    every size in ``SWEEP_BYTES``, then every op and dtype at the sizes of ``OP_BYTES``."""
    import torch.distributed as dist

    found: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {}
    for nbytes in [b for b in SWEEP_BYTES if not quick or b <= 64 << 10]:
        x = torch.zeros(nbytes // 4)  # zeros stay finite when reduced in place, call after call
        found[f"{prefix}/{_size_name(nbytes)}"] = (
            partial(dist.all_reduce, x),
            partial(accel.all_reduce, x, reduce_op="sum"),
        )
    if quick or not ops:
        return found
    for nbytes in [b for b in SWEEP_BYTES if b >= 64 << 10]:  # integers from 64 KiB: their flag's two ways
        x = torch.zeros(nbytes // 8, dtype=torch.int64)
        found[f"ops/int64-sum-{_size_name(nbytes)}"] = (
            partial(dist.all_reduce, x),
            partial(accel.all_reduce, x, reduce_op="sum"),
        )
    raw_ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    raw_ops["product"] = dist.ReduceOp.PRODUCT
    for nbytes in OP_BYTES:
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            x = torch.zeros(nbytes // dtype.itemsize, dtype=dtype)
            for op in OPS:
                if dtype == torch.bool and op in ("mean", "product"):
                    continue
                if op == "mean":  # raw: what a hand-written mean costs (gloo has no AVG; integers stay integers)

                    def raw(x: Any = x) -> None:
                        dist.all_reduce(x)
                        world = dist.get_world_size()
                        x.div_(world) if x.is_floating_point() else x.div_(world, rounding_mode="trunc")
                else:
                    raw = partial(dist.all_reduce, x, op=raw_ops[op])
                found[f"ops/{dtype_name}-{op}-{_size_name(nbytes)}"] = (raw, partial(accel.all_reduce, x, reduce_op=op))
    return found


def _measure_collectives(
    impl: str,
    rank: int,
    collectives: dict[str, tuple[Callable[[], object], Callable[[], object]]],
    rounds: int,
    limit: int,
) -> None:
    import torch.distributed as dist

    for measure, (raw_call, impl_call) in collectives.items():
        if not wanted(measure):
            continue
        calls = calls_per_round([raw_call, impl_call], limit)
        times = timed_rounds({"raw": raw_call, impl: impl_call}, rounds, calls, sync=dist.barrier)
        emit({"measure": measure, "impl": impl, "rank": rank, "calls": calls, "times": times})


def measure_sweep(impl: str, rounds: int, limit: int) -> None:
    """Under torchrun with any number of ranks: the payload sweep alone (``sweep3/...`` on 3 ranks)."""
    import torch.distributed as dist

    if PIN:
        pin_to_own_core()
    accel = make_impl(impl, devices=int(os.environ["WORLD_SIZE"]), strategy="ddp")
    accel.launch()
    world = dist.get_world_size()
    _measure_collectives(impl, dist.get_rank(), sweep(accel, limit < 10, f"sweep{world}", ops=False), rounds, limit)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("measure", choices=["step", "ddp", "sweep"])
    parser.add_argument("impl", choices=["fabric_lite", "lightning", "accelerate"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated name prefixes of the figures to measure")
    parser.add_argument("--pin", action="store_true", help="each rank on a core of its own, where there are enough")
    parser.add_argument("--rounds", type=int, help="rounds of each collective (default 30; --quick 3)")
    args = parser.parse_args()
    ONLY.extend(prefix for prefix in args.only.split(",") if prefix)
    global PIN
    PIN = args.pin
    # (rounds, steps per round) for training steps; (rounds, calls per round) for collectives
    rounds, steps = (3, 20) if args.quick else (15, 200)
    coll_rounds, coll_calls = (3, 5) if args.quick else (30, 100)
    coll_rounds = args.rounds or coll_rounds
    if args.measure == "step":
        measure_step(args.impl, rounds, steps)
    else:
        if args.measure == "sweep":
            measure_sweep(args.impl, coll_rounds, coll_calls)
        else:
            measure_ddp(args.impl, rounds, steps, coll_rounds, coll_calls)
        # every implementation's group ended alike (Lightning Fabric leaves its own to the interpreter's exit, where
        # gloo's threads can abort the process), now that the models are gone: see leave_process_group
        leave_process_group()


if __name__ == "__main__":
    main()
