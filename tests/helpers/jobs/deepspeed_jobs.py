"""DeepSpeed jobs on real gloo process groups on the CPU, run by tests/tiers/deepspeed/test_deepspeed.py with the Python
of
``.venv-deepspeed`` (``.ci/setup-deepspeed``).

    python -m tests.helpers.jobs.deepspeed_jobs JOB NPROCS OPTIONS_JSON OUT_PATH
    python -m torch.distributed.run --nproc-per-node 2 -m tests.helpers.jobs.deepspeed_jobs JOB 2 OPTIONS_JSON OUT_PATH

``OPTIONS_JSON`` holds ``strategy`` (a registry name) and the job's ``kwargs``. ``Fabric(..., devices=NPROCS)``
re-runs this module once per extra rank (``fabric.launch()`` of the ``deepspeed*`` names), or joins torchrun's
processes. A job may create further ``Fabric`` objects in the same processes (other strategies, the ``ddp``
reference): they join the process group the first one formed. Every rank runs ``JOB(fabric, **kwargs)``, recording
its checks one by one (an observation, or the traceback of a check that failed on that rank; see
``tests.helpers.harness.per_rank``), and rank 0 pickles the list of every rank's result to ``OUT_PATH``.

Nothing here compiles a DeepSpeed op: optimizers are torch's (with offload, ``"zero_force_ds_cpu_optimizer":
false``), and the strategy skips the shared-memory all-reduce extension on the CPU.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.strategies import DeepSpeedStrategy
from tests.helpers.jobs._runner import dump_all_ranks
from tests.helpers.jobs.checks import record

STEPS = 10
GLOBAL_BATCH = 4
LR = 0.01
# DeepSpeed's own config keys for a torch optimizer with offload, and no clipping (as in the arguments' config)
OFFLOAD = {"zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0}


class Counter:
    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def rank_batch(fabric: Any, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's equal slice of the global batch of ``step`` (and micro-batch): rank-dependent, reproducible."""
    g = torch.Generator().manual_seed(1000 + 10 * step + micro)
    x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 1, generator=g)
    n = GLOBAL_BATCH // fabric.world_size
    rows = slice(fabric.global_rank * n, (fabric.global_rank + 1) * n)
    return x[rows], y[rows]


def full_params(fmodel: Any) -> list[float]:
    """Every parameter, whole and in float32, flattened (ZeRO-3's partitions gathered first)."""
    import deepspeed

    params = list(fmodel.module.parameters())
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(partitioned, enabled=bool(partitioned)):
        return torch.cat([p.detach().float().flatten() for p in params]).tolist()


def max_difference(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return math.inf
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def new_fabric(strategy: Any, precision: str = "32-true", devices: int = 2) -> Fabric:
    fabric = Fabric(accelerator="cpu", devices=devices, strategy=strategy, precision=precision)
    fabric.launch()
    return fabric


def setup(fabric: Fabric, seed: int = 0) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    with fabric.init_module():
        model = make_model()
    return fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=LR))


def train(fabric: Fabric, fmodel: Any, foptimizer: Any, steps: range, accumulate: int = 1, gas: bool = False) -> list:
    """This rank's losses. With ``accumulate`` micro-batches per step: inside ``no_backward_sync`` (the loop's
    accumulation), or with DeepSpeed's ``gradient_accumulation_steps`` (``gas``: a step after every backward)."""
    losses = []
    for step in steps:
        for micro in range(accumulate):
            x, y = rank_batch(fabric, step, micro)
            last = micro == accumulate - 1
            with fabric.no_backward_sync(fmodel, enabled=not last and not gas):
                loss = nn.functional.mse_loss(fmodel(x), y)
                fabric.backward(loss, model=fmodel)  # one Fabric may hold several DeepSpeed models
            if gas:
                foptimizer.step()
            losses.append(loss.item())
        if not gas:
            foptimizer.step()
            foptimizer.zero_grad()
    return losses


def error_of(fn: Callable[[], Any]) -> dict[str, str | None]:
    try:
        fn()
    except Exception as err:
        return {"type": type(err).__name__, "message": str(err), "runtime_error": isinstance(err, RuntimeError)}
    return {"type": None, "message": "", "runtime_error": False}


# ---------------------------------------------------------------------------------------------- training
def training(fabric: Fabric) -> dict[str, Any]:
    """Launch, ranks and collectives of the first Fabric (``deepspeed_stage_1``, started by ``fabric.launch()``);
    then stages 1, 2, 3 and DDP over the same steps, bf16, ZeRO-3 partitioning, gradient accumulation, misuse."""

    def launched() -> dict[str, Any]:
        strategy = fabric.strategy
        assert isinstance(strategy, DeepSpeedStrategy)
        return {
            "ranks": [fabric.global_rank, fabric.local_rank, fabric.world_size],
            "device": str(fabric.device),
            "strategy": type(strategy).__name__,
            "stage": strategy.config["zero_optimization"]["stage"],
            "launcher": type(strategy.launcher).__name__,
            "sampler": strategy.distributed_sampler_kwargs,
            "precision": type(strategy.precision).__name__,
            "env": [os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")],
        }

    def collectives() -> dict[str, Any]:
        rank = fabric.global_rank
        return {
            "mean": fabric.all_reduce(torch.tensor(float(rank + 1))).item(),
            "gather": fabric.all_gather(torch.tensor([rank])).tolist(),
            "broadcast": fabric.broadcast({"from": rank}, src=1),
            "any": fabric.strategy.reduce_boolean_decision(rank == 1, all=False),
        }

    reference: dict[str, Any] = {}

    def parity() -> dict[str, Any]:
        out: dict[str, Any] = {}
        stage0 = DeepSpeedStrategy(stage=0)  # ZeRO off: DeepSpeed's own data parallel
        for name, strategy in (
            ("ddp", "ddp"),
            ("deepspeed_stage_0", stage0),
            ("deepspeed_stage_1", None),
            ("deepspeed_stage_2", "deepspeed_stage_2"),
            ("deepspeed_stage_3", "deepspeed_stage_3"),
        ):
            run = fabric if strategy is None else new_fabric(strategy)
            fmodel, foptimizer = setup(run)
            engine = fmodel._forward_module
            out[name] = {
                "losses": train(run, fmodel, foptimizer, range(STEPS)),
                "params": full_params(fmodel),
                "engine_world_size": getattr(engine, "world_size", None),
                "optimizer": type(foptimizer.optimizer).__name__,
            }
        reference.update(out)
        return out

    def stage3_partitioned() -> dict[str, Any]:
        run = new_fabric("deepspeed_stage_3")
        torch.manual_seed(0)
        with run.init_module(empty_init=True):
            model = make_model()
        created = [[p.numel(), getattr(p, "ds_numel", None)] for p in model.parameters()]
        fmodel, foptimizer = run.setup(model, torch.optim.AdamW(model.parameters(), lr=LR))
        local = [p.ds_tensor.numel() for p in fmodel.module.parameters()]
        losses = train(run, fmodel, foptimizer, range(STEPS))
        return {
            "created": created,
            "local": local,
            "after_setup": [p.numel() for p in fmodel.module.parameters()],
            "losses": losses,
        }

    def bf16() -> dict[str, Any]:
        out = {}
        for name, precision in (("deepspeed_stage_2", "bf16-mixed"), ("deepspeed_stage_3", "bf16-true")):
            run = new_fabric(name, precision)
            fmodel, foptimizer = setup(run)
            losses = train(run, fmodel, foptimizer, range(STEPS))
            out[f"{name}/{precision}"] = {
                "losses": losses,
                "param_dtype": str(next(fmodel.module.parameters()).dtype),
                "config_bf16": run.strategy.config.get("bf16"),
                "output_dtype": str(fmodel(rank_batch(run, 0)[0]).dtype),
            }
        return out

    def accumulation() -> dict[str, Any]:
        out = {}
        for name in ("ddp", "deepspeed_stage_2", "deepspeed_stage_3"):
            run = new_fabric(name)
            fmodel, foptimizer = setup(run)
            out[name] = {
                "losses": train(run, fmodel, foptimizer, range(4), accumulate=2),
                "params": full_params(fmodel),
            }
        config = {"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 2, **OFFLOAD}
        config.pop("zero_force_ds_cpu_optimizer")
        run = new_fabric(DeepSpeedStrategy(config=config))
        fmodel, foptimizer = setup(run)
        out["config_gas"] = {
            "losses": train(run, fmodel, foptimizer, range(4), accumulate=2, gas=True),
            "params": full_params(fmodel),
        }
        return out

    def misuse() -> dict[str, Any]:
        run = new_fabric("deepspeed_stage_2")
        torch.manual_seed(0)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        out: dict[str, Any] = {}
        out["setup_optimizers"] = error_of(lambda: run.setup_optimizers(optimizer))
        other = make_model()
        pair = [torch.optim.SGD(other.parameters(), lr=0.1), torch.optim.AdamW(other.parameters(), lr=LR)]
        out["two_optimizers"] = error_of(lambda: run.setup(other, *pair))
        fmodel, foptimizer = run.setup(model, optimizer)
        out["clip_norm"] = error_of(lambda: run.clip_gradients(fmodel, foptimizer, max_norm=1.0))
        out["clip_value"] = error_of(lambda: run.clip_gradients(fmodel, foptimizer, clip_val=0.5))
        x, y = rank_batch(run, 0)

        def twice() -> None:
            run.backward(nn.functional.mse_loss(fmodel(x), y))
            run.backward(nn.functional.mse_loss(fmodel(x), y))

        out["backward_twice"] = error_of(twice)
        foptimizer.step()

        def step_inside() -> None:
            with run.no_backward_sync(fmodel):
                run.backward(nn.functional.mse_loss(fmodel(x), y))
                foptimizer.step()

        out["step_inside_no_sync"] = error_of(step_inside)
        run.backward(nn.functional.mse_loss(fmodel(x), y))
        foptimizer.step()
        out["setup_module_stage2"] = error_of(lambda: run.setup_module(make_model()))
        out["load_without_state"] = error_of(lambda: run.load("anywhere"))
        out["save_filter"] = error_of(lambda: run.save("x", {"model": fmodel}, filter={"model": lambda k, v: True}))
        out["save_without_model"] = error_of(lambda: run.save("x", {"step": 1}))
        stage3 = new_fabric("deepspeed_stage_3")
        out["empty_init_false"] = error_of(lambda: stage3.init_module(empty_init=False))
        inference = stage3.setup_module(make_model())
        out["inference_forward"] = list(inference(x).shape)
        out["backward_without_optimizer"] = error_of(lambda: stage3.backward(inference(x).sum(), model=inference))
        second = make_model()
        trained, _ = stage3.setup(second, torch.optim.SGD(second.parameters(), lr=0.1))
        out["backward_ambiguous"] = error_of(lambda: stage3.backward(trained(x).sum()))
        return out

    return record(
        {
            "launched": launched,
            "collectives": collectives,
            "parity": parity,
            "stage3_partitioned": stage3_partitioned,
            "bf16": bf16,
            "accumulation": accumulation,
            "misuse": misuse,
        }
    )


# ---------------------------------------------------------------------------------------------- checkpoints
def checkpoints(fabric: Fabric, folder: str) -> dict[str, Any]:
    """Save and load (stage 2 in float32, stage 3 in bf16) with the user's other entries, resuming exactly;
    strictness, atomic replacement, offload, consolidation and loading a single file into ZeRO-3."""
    root = Path(folder)

    def round_trip(name: str, strategy: Any, precision: str) -> dict[str, Any]:
        run = fabric if strategy == "deepspeed_stage_2" and precision == "32-true" else new_fabric(strategy, precision)
        fmodel, foptimizer = setup(run)
        train(run, fmodel, foptimizer, range(3))
        counter = Counter(7)
        state = {
            "model": fmodel,
            "optimizer": foptimizer,
            "step": 3,
            "lr_scheduler": {"base": 0.5},
            "counter": counter,
            "note": "kept",
        }
        run.save(root / name, state)
        saved = full_params(fmodel)
        continued = train(run, fmodel, foptimizer, range(3, 5))
        # a fresh model and optimizer: another seed, so that nothing matches by chance
        fmodel2, foptimizer2 = setup(run, seed=123)
        state2 = {"model": fmodel2, "optimizer": foptimizer2, "step": 0, "lr_scheduler": None, "counter": Counter(0)}
        remainder = run.load(root / name, state2)
        loaded = full_params(fmodel2)
        resumed = train(run, fmodel2, foptimizer2, range(3, 5))
        return {
            "saved_vs_loaded": max_difference(saved, loaded),
            "continued": continued,
            "resumed": resumed,
            "entries": [state2["step"], state2["lr_scheduler"], state2["counter"].value],
            "remainder": remainder,
            "listing": sorted(p.name for p in (root / name).iterdir()),
            "saved_params": saved,
        }

    shared: dict[str, Any] = {}

    def stage2() -> dict[str, Any]:
        shared["stage2"] = round_trip("stage2", "deepspeed_stage_2", "32-true")
        return shared["stage2"]

    def stage3_bf16() -> dict[str, Any]:
        return round_trip("stage3", "deepspeed_stage_3", "bf16-mixed")

    def stage0() -> dict[str, Any]:
        return round_trip("stage0", DeepSpeedStrategy(stage=0), "32-true")

    def strictness() -> dict[str, Any]:
        fmodel, foptimizer = setup(fabric, seed=5)
        state = {"model": fmodel, "optimizer": foptimizer, "absent": 1}
        strict = error_of(lambda: fabric.load(root / "stage2", state))
        lenient = fabric.load(root / "stage2", state, strict=False)
        only_model = {"model": fmodel}
        rest = fabric.load(root / "stage2", only_model)
        return {
            "strict": strict,
            "lenient_state": state["absent"],
            "lenient_remainder": sorted(lenient),
            "model_only_remainder": sorted(rest),
        }

    def replace_and_refuse() -> dict[str, Any]:
        fmodel, foptimizer = setup(fabric, seed=6)
        target = root / "replaced"
        fabric.save(target, {"model": fmodel, "optimizer": foptimizer, "step": 1})
        fabric.save(target, {"model": fmodel, "optimizer": foptimizer, "step": 2})
        step = {"model": fmodel, "optimizer": foptimizer, "step": 0}
        fabric.load(target, step)
        other = root / "not_a_checkpoint"
        if fabric.global_rank == 0:
            other.mkdir(exist_ok=True)
            (other / "precious.txt").write_text("mine")
        fabric.barrier()
        refused = error_of(lambda: fabric.save(other, {"model": fmodel, "step": 3}))
        inside = error_of(lambda: fabric.load(root / "stage2" / "checkpoint", {"model": fmodel}))
        return {
            "step": step["step"],
            "refused": refused,
            "kept": (other / "precious.txt").read_text(),
            "leftovers": sorted(p.name for p in root.iterdir() if p.name.startswith(".")),
            "inside": inside,
        }

    def offload() -> dict[str, Any]:
        out = {}
        for name, zero in (
            ("stage2_offload", {"stage": 2, "offload_optimizer": {"device": "cpu"}}),
            (
                "stage3_offload",
                {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
            ),
        ):
            run = new_fabric(DeepSpeedStrategy(config={"zero_optimization": zero, **OFFLOAD}))
            fmodel, foptimizer = setup(run)
            out[name] = {"losses": train(run, fmodel, foptimizer, range(STEPS)), "params": full_params(fmodel)}
        reference = new_fabric("ddp")
        fmodel, foptimizer = setup(reference)
        out["ddp"] = {"losses": train(reference, fmodel, foptimizer, range(STEPS)), "params": full_params(fmodel)}
        return out

    def consolidation() -> dict[str, Any]:
        from fabric_lite.utilities import consolidate_checkpoint

        out: dict[str, Any] = {}
        if fabric.global_rank == 0:
            try:  # one process consolidates; the other waits at the barrier below, whatever happens here
                consolidate_checkpoint(root / "stage2", root / "stage2.pt")
                whole = torch.load(root / "stage2.pt", weights_only=True)
                flat = torch.cat([v.float().flatten() for v in whole["model"].values()]).tolist()
                out["keys"] = sorted(whole)
                out["vs_saved"] = max_difference(flat, shared["stage2"]["saved_params"])
                out["entries"] = [whole["step"], whole["lr_scheduler"], whole["counter"], whole["note"]]
            except Exception:
                out["rank0_traceback"] = traceback.format_exc()
        fabric.barrier()
        # the single file into a ZeRO-3 model (its partitions gathered for the load)
        run = new_fabric("deepspeed_stage_3")
        fmodel, foptimizer = setup(run, seed=77)
        state = {"model": fmodel, "step": 0, "counter": Counter(0)}
        remainder = run.load(root / "stage2.pt", state)
        out["into_stage3"] = max_difference(full_params(fmodel), shared["stage2"]["saved_params"])
        out["into_stage3_entries"] = [state["step"], state["counter"].value, sorted(remainder)]
        out["into_stage3_trains"] = train(run, fmodel, foptimizer, range(3, 5))
        out["optimizer_from_file"] = error_of(
            lambda: run.load(root / "stage2.pt", {"model": fmodel, "optimizer": foptimizer})
        )
        return out

    return record(
        {
            "stage2": stage2,
            "stage3_bf16": stage3_bf16,
            "stage0": stage0,
            "strictness": strictness,
            "replace_and_refuse": replace_and_refuse,
            "offload": offload,
            "consolidation": consolidation,
        }
    )


def other_world_size(fabric: Fabric, folder: str) -> dict[str, Any]:
    """The stage-2 checkpoint of two ranks, loaded by this job's ranks: weights and entries, not the optimizer."""
    root = Path(folder)

    def weights() -> dict[str, Any]:
        fmodel, foptimizer = setup(fabric, seed=9)
        state = {"model": fmodel, "step": 0, "counter": Counter(0), "lr_scheduler": None}
        remainder = fabric.load(root / "stage2", state)
        return {
            "params": full_params(fmodel),
            "entries": [state["step"], state["counter"].value, state["lr_scheduler"]],
            "remainder": remainder,
            "world_size": fabric.world_size,
        }

    def with_optimizer() -> dict[str, Any]:
        fmodel, foptimizer = setup(fabric, seed=9)
        return error_of(lambda: fabric.load(root / "stage2", {"model": fmodel, "optimizer": foptimizer}))

    return record({"weights": weights, "with_optimizer": with_optimizer})


def main() -> None:
    job, nprocs, options_json, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    spec = json.loads(options_json)
    fabric = new_fabric(spec.get("strategy", "deepspeed"), spec.get("precision", "32-true"), devices=nprocs)
    # every later Fabric joins this process group: a rank that misses a collective fails the job in 2 minutes
    fabric.strategy.set_collective_timeout(timedelta(seconds=120))
    result = globals()[job](fabric, **spec.get("kwargs", {}))
    dump_all_ranks(fabric, result, out)


if __name__ == "__main__":
    main()
