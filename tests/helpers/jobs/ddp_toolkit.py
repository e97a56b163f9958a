"""Job functions for tests/distributed/test_ddp_toolkit.py and tests/distributed/test_distributed_utils.py.

``suite`` runs on every rank (``spawn_job("tests.helpers.jobs.ddp_toolkit:suite", nprocs)``) and returns ``{check:
{"value":
...}}`` (or ``{"traceback": ...}`` when a check raised on that rank). Every check runs on every rank in the same
order, so one failing check cannot desynchronise the others. Inputs depend on the rank, so every expected value is
exact; where the reference needs the other ranks' data (local gradients, a global batch), the check computes it
here with plain ``torch.distributed`` calls and returns both sides.

Strategies configured with hooks, sync batchnorm or DDP arguments are built by :func:`fabric_with`: a second
``Fabric`` over the job's process group, created as under an external launcher (the environment names the rank).
"""

from __future__ import annotations

import copy
import functools
import os
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fabric_lite import Fabric
from fabric_lite.plugins.environments import LightningEnvironment
from fabric_lite.strategies import DDPStrategy
from fabric_lite.utilities.distributed import (
    AllGatherGrad,
    _InfiniteBarrier,
    all_gather_ddp_if_available,
    gather_all_tensors,
    init_dist_connection,
    register_ddp_comm_hook,
    sync_ddp,
    sync_ddp_if_available,
)

SUBGROUP = (0, 2)
METRIC_CASES = ((5, 2), (82, 8))  # (dataset size, batch size)


def record(obs: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    try:
        obs[name] = {"value": fn()}
    except Exception:
        obs[name] = {"traceback": traceback.format_exc()}


def raised(fn: Callable[[], Any]) -> tuple[str, str, tuple[str, ...]]:
    """The class name, message and base classes of what ``fn`` raised; fails the check when it raises nothing."""
    try:
        fn()
    except Exception as err:
        return type(err).__name__, str(err), tuple(c.__name__ for c in type(err).__mro__)
    raise AssertionError("expected an exception, nothing was raised")


def fabric_with(fabric: Fabric, debug: bool = False, **strategy_kwargs: Any) -> Fabric:
    """Another Fabric over this job's process group, with ``DDPStrategy(**strategy_kwargs)`` (and ``debug``).

    Built as under torchrun: the environment names this process's rank, and the existing process group is used.
    """
    env = {
        "LOCAL_RANK": str(fabric.local_rank),
        "RANK": str(fabric.global_rank),
        "WORLD_SIZE": str(fabric.world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",  # never used: the process group exists
    }
    os.environ.update(env)
    other = Fabric(
        accelerator="cpu",
        devices=fabric.world_size,
        strategy=DDPStrategy(**strategy_kwargs),
        plugins=[LightningEnvironment(env)],
        debug=debug,
    )
    other.launch()
    return other


def gather_rows(t: Tensor) -> Tensor:
    """Every rank's ``t`` stacked, with torch's own collective (independent of the code under test)."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return torch.stack(out)


def flat_grads(module: nn.Module) -> Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- models, inputs
def mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)).to(dtype)


def mlp_input(rank: int, step: int, dtype: torch.dtype = torch.float32) -> Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(1, 16, generator=generator).to(dtype)  # one sample: each rank's gradients have rank 1


def bn_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1)).double()


def bn_batch(rank: int) -> Tensor:
    """Rank ``r`` has ``3 + 2r`` samples: the ranks' batches differ in size."""
    generator = torch.Generator().manual_seed(7 + rank)
    return (torch.randn(3 + 2 * rank, 3, generator=generator) * (rank + 1) + rank).double()


# ---------------------------------------------------------------------------------------------- the suite
def suite(fabric: Fabric) -> dict[str, Any]:
    obs: dict[str, Any] = {}
    if fabric.world_size == 2:
        _hooks(fabric, obs)
        _post_local_sgd(fabric, obs)
        _sync_batchnorm(fabric, obs)
        _backward_sync(fabric, obs)
        _ddp_arguments(fabric, obs)
        _utilities(fabric, obs)
    if fabric.world_size >= 3:
        _subgroups(fabric, obs)
    _metrics(fabric, obs)
    record(obs, "healthy_after", lambda: sync_ddp(torch.tensor(fabric.global_rank + 1.0)).item())
    return obs


def _hook_grads(fabric: Fabric, steps: int = 1, **strategy_kwargs: Any) -> dict[str, Any]:
    """Backward ``steps`` times on the same weights; the gradients of the last step, synced and local."""
    rank = fabric.global_rank
    other = fabric_with(fabric, **strategy_kwargs)
    model = other.setup(mlp())
    for step in range(steps):
        model.zero_grad()
        other.backward(model(mlp_input(rank, step)).square().sum())
    synced = flat_grads(model)
    # this rank's own gradients of the last step, without DDP
    local = mlp()
    local(mlp_input(rank, steps - 1)).square().sum().backward()
    return {"synced": synced, "local": gather_rows(flat_grads(local)), "model": model}


def _hooks(fabric: Fabric, obs: dict[str, Any]) -> None:
    world = fabric.world_size

    def plain() -> dict[str, Any]:
        out = _hook_grads(fabric)
        return {"synced": out["synced"].tolist(), "mean_of_local": out["local"].mean(0).tolist()}

    record(obs, "hook/none", plain)

    def fp16(**kwargs: Any) -> dict[str, Any]:
        out = _hook_grads(fabric, **kwargs)
        baseline = out["local"].mean(0)
        # the hook divides each rank's gradients by the world size in float16 and sums them in float16
        halves = out["local"].half() / world
        expected = (halves[0] + halves[1]).float()
        return {
            "max_error_vs_fp16_reference": (out["synced"] - expected).abs().max().item(),
            "max_error_vs_uncompressed": (out["synced"] - baseline).abs().max().item(),
            "max_abs": baseline.abs().max().item(),
            "differs_from_uncompressed": not torch.equal(out["synced"], baseline),
        }

    record(obs, "hook/fp16", lambda: fp16(ddp_comm_hook=default_hooks.fp16_compress_hook))
    record(
        obs,
        "hook/fp16_wrapper_allreduce",
        lambda: fp16(ddp_comm_hook=default_hooks.allreduce_hook, ddp_comm_wrapper=default_hooks.fp16_compress_wrapper),
    )

    def power_sgd(wrapper: Any = None) -> dict[str, Any]:
        # start_powerSGD_iter=2: two plain all-reduces, then the third backward is compressed. Rank 2
        # approximation of a sum of two rank-1 gradients (one sample per rank): exact up to rounding.
        factory = functools.partial(
            powerSGD_hook.PowerSGDState, process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2
        )
        out = _hook_grads(fabric, steps=3, ddp_comm_state=factory, ddp_comm_hook=powerSGD_hook.powerSGD_hook,
                          ddp_comm_wrapper=wrapper)  # fmt: skip
        baseline = out["local"].mean(0)
        return {
            "max_error_vs_uncompressed": (out["synced"] - baseline).abs().max().item(),
            "max_abs": baseline.abs().max().item(),
        }

    record(obs, "hook/powersgd", power_sgd)
    record(obs, "hook/powersgd_fp16_wrapper", lambda: power_sgd(default_hooks.fp16_compress_wrapper))

    def power_sgd_compresses() -> dict[str, Any]:
        # the same, with the state given as an object: its counters show that compression happened
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        out = _hook_grads(fabric, steps=3, ddp_comm_state=state, ddp_comm_hook=powerSGD_hook.powerSGD_hook)
        baseline = out["local"].mean(0)
        return {
            "iter": state.iter,
            "numel_before": state.total_numel_before_compression,
            "numel_after": state.total_numel_after_compression,
            "max_error_vs_uncompressed": (out["synced"] - baseline).abs().max().item(),
        }

    record(obs, "hook/powersgd_rank1_state", power_sgd_compresses)

    def bf16_on_cpu() -> tuple[str, str, tuple[str, ...]]:
        other = fabric_with(fabric, ddp_comm_hook=default_hooks.bf16_compress_hook)
        return raised(lambda: other.setup(mlp()))

    record(obs, "hook/bf16_cpu", bf16_on_cpu)


def _post_local_sgd(fabric: Fabric, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    lr = 0.1

    def run(state_as_factory: bool) -> list[dict[str, Any]]:
        def make() -> Any:
            return post_localSGD_hook.PostLocalSGDState(
                process_group=None, subgroup=None, start_localSGD_iter=2, post_local_gradient_allreduce=False
            )

        other = fabric_with(
            fabric,
            ddp_comm_state=make if state_as_factory else make(),
            ddp_comm_hook=post_localSGD_hook.post_localSGD_hook,
            model_averaging_period=3,
        )
        torch.manual_seed(0)
        module = nn.Linear(4, 2)
        model, optimizer = other.setup(module, torch.optim.SGD(module.parameters(), lr=lr))
        steps = []
        for step in range(8):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(50 * step + rank)) * (rank + 1)
            before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            optimizer.zero_grad()
            other.backward(model(x).square().sum())
            grad = flat_grads(model).clone()
            optimizer.step()
            after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            everyone = gather_rows(after)
            # the parameters each rank would hold after its own (local) step, averaged over the ranks
            local_then_averaged = gather_rows(before - lr * grad).mean(0)
            steps.append(
                {
                    "equal_across_ranks": bool((everyone == everyone[0]).all()),
                    "error_vs_average_of_local_steps": (after - local_then_averaged).abs().max().item(),
                    "grad_equal_across_ranks": bool((gather_rows(grad) == grad).all()),
                }
            )
        return steps

    record(obs, "post_local_sgd/factory", lambda: run(True))
    record(obs, "post_local_sgd/instance", lambda: run(False))
    del world


def _sync_batchnorm(fabric: Fabric, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    batches = [bn_batch(r) for r in range(world)]
    total = sum(len(b) for b in batches)
    start = sum(len(b) for b in batches[:rank])

    def run(sync: bool) -> dict[str, Any]:
        reference = bn_model()
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
        global_batch = torch.cat(batches)
        ref_out = reference(global_batch)
        ref_out.square().mean().backward()
        ref_grads = flat_grads(reference)
        ref_optimizer.step()

        other = fabric_with(fabric, sync_batchnorm=sync)
        module = bn_model()
        model, optimizer = other.setup(module, torch.optim.SGD(module.parameters(), lr=0.5))
        out = model(batches[rank])
        # DDP averages the ranks' gradients: scaled so, they are the gradients of the global batch's mean
        other.backward(out.square().sum() * world / total)
        grads = flat_grads(model)
        optimizer.step()
        layer = model.module[1]
        ref_layer = reference[1]
        eval_input = torch.linspace(-2, 2, 12, dtype=torch.float64).reshape(4, 3)
        model.eval()
        reference.eval()
        return {
            "layer_type": type(layer).__name__,
            "out_error": (out - ref_out[start : start + len(out)]).abs().max().item(),
            "grad_error": (grads - ref_grads).abs().max().item(),
            "running_mean_error": (layer.running_mean - ref_layer.running_mean).abs().max().item(),
            "running_var_error": (layer.running_var - ref_layer.running_var).abs().max().item(),
            "num_batches_tracked": int(layer.num_batches_tracked),
            "param_error": max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters())),
            "eval_error": (model(eval_input) - reference(eval_input)).abs().max().item(),
            "running_mean": layer.running_mean.tolist(),
        }

    record(obs, "sync_batchnorm/on", lambda: run(True))
    record(obs, "sync_batchnorm/off", lambda: run(False))

    def nested_layers() -> dict[str, Any]:
        # BatchNorm2d on 4-d input and a BatchNorm1d inside a nested container, against one process's BatchNorm
        torch.manual_seed(2)
        module = nn.Sequential(
            nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.Flatten(), nn.Sequential(nn.Linear(48, 3), nn.BatchNorm1d(3))
        )
        reference = copy.deepcopy(module)
        weight = module[1].weight
        other = fabric_with(fabric, sync_batchnorm=True)
        model = other.setup(module)
        inputs = [torch.randn(2 + r, 2, 4, 4, generator=torch.Generator().manual_seed(r)) for r in range(world)]
        out = model(inputs[rank])
        ref_out = reference(torch.cat(inputs))
        begin = sum(len(x) for x in inputs[:rank])
        layers = [m for m in model.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        ref_layers = [m for m in reference.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        return {
            "types": [type(m).__name__ for m in layers],
            "same_parameter_object": model.module[1].weight is weight,
            "out_error": (out - ref_out[begin : begin + len(out)]).abs().max().item(),
            "running_error": max(
                (a.running_mean - b.running_mean).abs().max().item()
                + (a.running_var - b.running_var).abs().max().item()
                for a, b in zip(layers, ref_layers)
            ),
        }

    record(obs, "sync_batchnorm/nested", nested_layers)


def _backward_sync(fabric: Fabric, obs: dict[str, Any]) -> None:
    rank = fabric.global_rank

    def run(use_fabric_api: bool) -> dict[str, Any]:
        module = mlp(torch.float64)
        local = copy.deepcopy(module)
        model = fabric.setup(module)
        strategy = fabric.strategy
        x1, x2 = mlp_input(rank, 1, torch.float64), mlp_input(rank, 2, torch.float64)
        context = fabric.no_backward_sync(model) if use_fabric_api else strategy.block_backward_sync(model)  # type: ignore[attr-defined]
        with context:
            fabric.backward(model(x1).square().sum())
        inside = flat_grads(model).clone()
        fabric.backward(model(x2).square().sum())
        after = flat_grads(model)
        local(x1).square().sum().backward()
        local_first = flat_grads(local).clone()
        local(x2).square().sum().backward()
        accumulated = gather_rows(flat_grads(local))
        return {
            "inside_error_vs_local": (inside - local_first).abs().max().item(),
            "inside_equal_across_ranks": bool((gather_rows(inside) == inside).all()),
            "after_error_vs_mean_of_accumulated": (after - accumulated.mean(0)).abs().max().item(),
        }

    record(obs, "block_backward_sync", lambda: run(False))
    record(obs, "no_backward_sync", lambda: run(True))


def _ddp_arguments(fabric: Fabric, obs: dict[str, Any]) -> None:
    def passthrough() -> dict[str, Any]:
        other = fabric_with(fabric, bucket_cap_mb=1, gradient_as_bucket_view=True, broadcast_buffers=False)
        ddp = other.setup(mlp())._forward_module
        default = fabric_with(fabric).setup(mlp())._forward_module
        unused = fabric_with(fabric, find_unused_parameters=True).setup(mlp())._forward_module
        return {
            "bucket_bytes_cap": ddp.bucket_bytes_cap,
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "broadcast_buffers": ddp.broadcast_buffers,
            "default_find_unused_parameters": default.find_unused_parameters,
            "find_unused_parameters": unused.find_unused_parameters,
        }

    record(obs, "ddp_arguments", passthrough)

    def reduce() -> list[Any]:
        strategy = fabric.strategy
        t = torch.tensor(fabric.global_rank * 2 + 1.0)
        return [
            strategy.reduce(t).item(),
            strategy.reduce(torch.tensor(1.0), reduce_op="sum").item(),
            strategy.reduce("x"),
        ]  # type: ignore[attr-defined]

    record(obs, "strategy_reduce", reduce)


def _utilities(fabric: Fabric, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size

    def gather_no_grad() -> dict[str, Any]:
        x = torch.ones(2, requires_grad=True)
        out = all_gather_ddp_if_available(x * (rank + 1))
        return {"value": out.tolist(), "requires_grad": out.requires_grad}

    record(obs, "all_gather_ddp/no_grad", gather_no_grad)

    def gather_grads(use_function: bool) -> dict[str, Any]:
        x = torch.full((2,), rank + 1.0, requires_grad=True)
        out = AllGatherGrad.apply(x) if use_function else all_gather_ddp_if_available(x, sync_grads=True)
        # rank r's loss weighs rank k's slice by (r + 1) * (k + 2)
        weights = torch.tensor([(rank + 1) * (k + 2) for k in range(world)], dtype=torch.float32)
        (out.sum(1) * weights).sum().backward()
        return {"value": out.tolist(), "grad": x.grad.tolist()}  # type: ignore[union-attr]

    record(obs, "all_gather_ddp/sync_grads", lambda: gather_grads(False))
    record(obs, "all_gather_grad/apply", lambda: gather_grads(True))
    record(obs, "all_gather_ddp/mismatch", lambda: raised(lambda: all_gather_ddp_if_available(torch.zeros(rank + 1))))

    def uneven(shape_of: Callable[[int], tuple[int, ...]]) -> list[Any]:
        shape = shape_of(rank)
        t = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape) + 100 * rank
        return [(list(g.shape), g.tolist()) for g in gather_all_tensors(t)]

    record(obs, "gather_all/1d", lambda: uneven(lambda r: (r + 1,)))
    record(obs, "gather_all/2d", lambda: uneven(lambda r: (r + 1, 3 - r)))
    record(obs, "gather_all/3d", lambda: uneven(lambda r: (2, r + 1, 1 + 2 * r)))
    record(obs, "gather_all/empty", lambda: uneven(lambda r: (2 * r, 2)))
    record(obs, "gather_all/scalar", lambda: uneven(lambda r: ()))
    record(
        obs,
        "gather_all/ndim_mismatch",
        lambda: raised(lambda: gather_all_tensors(torch.zeros((2,) if rank == 0 else (2, 1)))),
    )
    record(
        obs,
        "gather_all/dtype_mismatch",
        lambda: raised(lambda: gather_all_tensors(torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.int64))),
    )

    def sync(op: Any, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        t = torch.tensor([rank + 1, 10 * rank - 3], dtype=dtype)
        out = sync_ddp(t, reduce_op=op)
        return {"value": out.tolist(), "dtype": str(out.dtype), "in_place": out is t}

    for name, op in (("none", None), ("sum", "sum"), ("mean", "mean"), ("avg", "AVG"), ("max", "max")):
        record(obs, f"sync_ddp/{name}", lambda op=op: sync(op))
    record(obs, "sync_ddp/ReduceOp.SUM", lambda: sync(dist.ReduceOp.SUM))
    record(obs, "sync_ddp/ReduceOp.AVG", lambda: sync(dist.ReduceOp.AVG))
    record(obs, "sync_ddp/int_mean", lambda: sync("mean", torch.int64))
    record(obs, "sync_ddp/number", lambda: sync_ddp(rank + 1).tolist())
    record(obs, "sync_ddp/unknown_op", lambda: raised(lambda: sync_ddp(torch.ones(1), reduce_op="median")))
    record(
        obs,
        "sync_ddp_if_available/mean",
        lambda: sync_ddp_if_available(torch.tensor(rank * 4.0), reduce_op="mean").item(),
    )  # type: ignore[union-attr]

    def init_again() -> dict[str, Any]:
        env = LightningEnvironment({"MASTER_PORT": "1"})
        same = init_dist_connection(env, "gloo", global_rank=rank, world_size=world)
        other_size = raised(lambda: init_dist_connection(env, "gloo", global_rank=rank, world_size=world + 1))
        other_backend = raised(lambda: init_dist_connection(env, "nccl", global_rank=rank, world_size=world))
        return {"same": same, "other_size": other_size, "other_backend": other_backend, "rank": dist.get_rank()}

    record(obs, "init_dist_connection", init_again)

    def register_function() -> dict[str, Any]:
        model = fabric.setup(mlp())
        register_ddp_comm_hook(model, ddp_comm_hook=default_hooks.fp16_compress_hook)
        model(mlp_input(rank, 0)).square().sum().backward()
        local = mlp()
        local(mlp_input(rank, 0)).square().sum().backward()
        halves = gather_rows(flat_grads(local)).half() / world
        expected = (halves[0] + halves[1]).float()
        return {
            "max_error_vs_fp16_reference": (flat_grads(model) - expected).abs().max().item(),
            "not_ddp": raised(
                lambda: register_ddp_comm_hook(nn.Linear(2, 2), ddp_comm_hook=default_hooks.allreduce_hook)
            ),
            "wrapper_without_hook": raised(
                lambda: register_ddp_comm_hook(model, ddp_comm_wrapper=default_hooks.fp16_compress_wrapper)
            ),
            "nothing": register_ddp_comm_hook(model),
        }

    record(obs, "register_ddp_comm_hook", register_function)

    def infinite_barrier() -> dict[str, Any]:
        """Rank 1 waits in the barrier for rank 0, longer than the process group's timeout allows."""
        fabric.strategy.set_collective_timeout(timedelta(seconds=1))  # type: ignore[attr-defined]
        try:
            start = time.monotonic()
            with _InfiniteBarrier() as barrier:
                if rank == 0:
                    time.sleep(3)
                barrier()
            return {"waited": time.monotonic() - start, "group_left": barrier.group in dist.distributed_c10d._pg_map}
        finally:
            fabric.strategy.set_collective_timeout(timedelta(seconds=60))  # type: ignore[attr-defined]

    record(obs, "infinite_barrier", infinite_barrier)


def _subgroups(fabric: Fabric, obs: dict[str, Any]) -> None:
    """Collectives over ``new_group([0, 2])``: every rank creates the group, only its members call them."""
    rank = fabric.global_rank
    group = dist.new_group(list(SUBGROUP))
    if rank not in SUBGROUP:
        return
    member = SUBGROUP.index(rank)

    def grads() -> dict[str, Any]:
        x = torch.full((2,), rank + 1.0, requires_grad=True)
        out = all_gather_ddp_if_available(x, group=group, sync_grads=True)
        weights = torch.tensor([(member + 1) * (k + 2) for k in range(len(SUBGROUP))], dtype=torch.float32)
        (out.sum(1) * weights).sum().backward()
        return {"value": out.tolist(), "grad": x.grad.tolist()}  # type: ignore[union-attr]

    record(obs, "subgroup/all_gather_ddp_sync_grads", grads)
    record(
        obs,
        "subgroup/gather_all_tensors",
        lambda: [g.tolist() for g in gather_all_tensors(torch.arange(rank + 1) + 10 * rank, group=group)],
    )
    record(
        obs, "subgroup/sync_ddp_mean", lambda: sync_ddp(torch.tensor(rank + 1.0), group=group, reduce_op="mean").item()
    )
    record(obs, "subgroup/sync_ddp_sum", lambda: sync_ddp(torch.tensor(rank + 1), group=group).item())
    record(
        obs,
        "subgroup/fabric_all_reduce",
        lambda: fabric.all_reduce(torch.tensor(rank + 1.0), group=group, reduce_op="sum").item(),
    )
    record(obs, "subgroup/fabric_all_gather", lambda: fabric.all_gather(torch.tensor([rank]), group=group).tolist())
    record(
        obs,
        "subgroup/ndim_mismatch",
        lambda: raised(lambda: gather_all_tensors(torch.zeros((1,) if rank == 0 else (1, 1)), group=group)),
    )


def _metrics(fabric: Fabric, obs: dict[str, Any]) -> None:
    for size, batch_size in METRIC_CASES:
        record(obs, f"metrics/{size}", lambda s=size, b=batch_size: _metric_case(fabric, s, b))
    _metric_errors(fabric, obs)


def _dataset(size: int) -> TensorDataset:
    index = torch.arange(size)
    features = torch.stack([index.float(), -index.float()], dim=1)
    labels = index % 3
    return TensorDataset(index, features, labels)


def _metric_case(fabric: Fabric, size: int, batch_size: int) -> dict[str, Any]:
    data = _dataset(size)
    result: dict[str, Any] = {}

    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=batch_size))
    per_batch, naive, nested_ok, correct = [], 0, True, 0
    local_epoch = []
    for index, features, labels in loader:
        predictions = (features[:, 0].long() + (index % 2)) % 3  # right on even samples
        gathered = fabric.gather_for_metrics({"i": index, "pair": (predictions, labels), "tag": "batch"})
        per_batch.append(gathered["i"])
        nested_ok &= gathered["tag"] == "batch" and len(gathered["pair"][0]) == len(gathered["i"])
        correct += int((gathered["pair"][0] == gathered["pair"][1]).sum())
        naive += len(fabric.all_gather(index).reshape(-1))
        local_epoch.append(index)
    result["per_batch"] = torch.cat(per_batch).tolist()
    result["naive_count"] = naive
    result["nested_ok"] = nested_ok
    result["accuracy"] = correct / len(result["per_batch"])
    # after the loop: the whole epoch's results at once
    result["whole_epoch"] = fabric.gather_for_metrics(torch.cat(local_epoch), dataloader=loader).tolist()

    shuffled = fabric.setup_dataloaders(DataLoader(data, batch_size=batch_size, shuffle=True))
    result["shuffled"] = torch.cat([fabric.gather_for_metrics(i) for i, _, _ in shuffled]).tolist()

    sampler = DistributedSampler(
        data, num_replicas=fabric.world_size, rank=fabric.global_rank, shuffle=False, drop_last=True
    )
    dropping = fabric.setup_dataloaders(DataLoader(data, batch_size=batch_size, sampler=sampler))
    result["sampler_drop_last"] = torch.cat(
        [fabric.gather_for_metrics(i) for i, _, _ in dropping] or [torch.zeros(0)]
    ).tolist()

    batch_dropping = fabric.setup_dataloaders(DataLoader(data, batch_size=batch_size, drop_last=True))
    gathered = [fabric.gather_for_metrics(i) for i, _, _ in batch_dropping]
    result["loader_drop_last"] = torch.cat(gathered).tolist() if gathered else []

    unsplit = fabric.setup_dataloaders(DataLoader(data, batch_size=batch_size), use_distributed_sampler=False)
    result["unsplit_count"] = sum(len(fabric.gather_for_metrics(i)) for i, _, _ in unsplit)
    return result


def _metric_errors(fabric: Fabric, obs: dict[str, Any]) -> None:
    data = _dataset(5)
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=2))

    def inside(fn: Callable[[Tensor], Any]) -> tuple[str, str, tuple[str, ...]]:
        for index, _, _ in loader:
            return raised(lambda: fn(index))
        raise AssertionError("empty loader")

    record(obs, "metrics_error/scalar", lambda: inside(lambda i: fabric.gather_for_metrics(i.sum())))
    record(obs, "metrics_error/rows", lambda: inside(lambda i: fabric.gather_for_metrics(torch.cat([i, i]))))
    record(obs, "metrics_error/no_loader", lambda: raised(lambda: fabric.gather_for_metrics(torch.zeros(2))))
    record(
        obs,
        "metrics_error/too_many_rows",
        lambda: raised(lambda: fabric.gather_for_metrics(torch.zeros(9), dataloader=loader)),
    )
