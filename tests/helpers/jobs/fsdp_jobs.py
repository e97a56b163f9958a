"""FSDP jobs, run on real gloo process groups on the CPU by tests/distributed/test_fsdp.py, through fabric_lite's own
launcher.

    python -m tests.helpers.jobs.fsdp_jobs JOB NPROCS OPTIONS_JSON OUT_PATH
    python -m tests.helpers.jobs.fsdp_jobs series NPROCS '[OPTIONS, ...]' OUT_PATH

``OPTIONS_JSON`` holds ``strategy`` (``"fsdp"``, or the keyword arguments of an ``FSDPStrategy``, layer classes by
name), ``precision`` and the job's ``kwargs``. ``Fabric(..., devices=NPROCS)`` re-runs this module once per extra
rank (the script launcher of ``strategy="fsdp"``); every rank runs ``JOB(fabric, **kwargs)`` and rank 0 pickles
the list of every rank's result to ``OUT_PATH``. Each job records its checks one by one: an observation, or the
traceback of a check that failed on that rank (see ``tests.helpers.harness.per_rank``). A ``series`` runs several
jobs in one launch (see ``tests.helpers.jobs._runner.serve``).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.nn.parallel import DistributedDataParallel

from fabric_lite import Fabric
from fabric_lite.plugins.precision import FSDPPrecision
from fabric_lite.strategies import FSDPStrategy
from tests.helpers.jobs._runner import serve
from tests.helpers.jobs.checks import record

STEPS = 10
GLOBAL_BATCH = 12  # splits evenly over 1, 2 and 3 ranks
LR = 0.1
MAX_NORM = 0.5


# ---------------------------------------------------------------------------------------------- models and data
class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(6, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.out = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


class InitNet(nn.Module):
    """For the meta-device check: an embedding tied to the head, blocks, and a batch norm with buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 10)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.blocks(self.embed(tokens))))


class NoReset(nn.Module):
    """Holds a parameter but has no reset_parameters: from the meta device it is left uninitialised, with a warning
    (its ``lin`` is initialised)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.lin = nn.Linear(4, 4)


class Counter:
    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


class Unpicklable:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("this object refuses to be pickled")


CLASSES = {"Block": Block}


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)


def rank_batch(fabric: Any, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's equal slice of the global batch: the mean of the ranks' losses is the global batch's loss."""
    x, y = global_batch(step)
    n = GLOBAL_BATCH // fabric.world_size
    rows = slice(fabric.global_rank * n, (fabric.global_rank + 1) * n)
    return x[rows], y[rows]


def full_model_state(fmodel: Any) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict on every rank, through torch's own API (independent of fabric.save)."""
    state = get_model_state_dict(fmodel.module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in state.items()}


def full_optimizer_state(fmodel: Any, foptimizer: Any) -> dict[str, Any]:
    options = StateDictOptions(full_state_dict=True)
    return get_optimizer_state_dict(fmodel.module, foptimizer.optimizer, options=options)


def fsdp_units(module: nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    return sorted(name for name, m in module.named_modules() if isinstance(m, FSDPModule))


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if sorted(a) != sorted(b):
        return math.inf
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def setup_model(fabric: Any, seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    fmodel = fabric.setup_module(Net())
    foptimizer = fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=LR, momentum=0.9))
    return fmodel, foptimizer


def train_step(fabric: Any, fmodel: Any, foptimizer: Any, step: int) -> tuple[float, float]:
    x, y = rank_batch(fabric, step)
    loss = nn.functional.mse_loss(fmodel(x), y)
    foptimizer.zero_grad()
    fabric.backward(loss)
    norm = fabric.clip_gradients(fmodel, foptimizer, max_norm=MAX_NORM)
    foptimizer.step()
    return loss.item(), norm.item()


def error_of(fn: Callable[[], Any]) -> dict[str, str | None]:
    try:
        fn()
    except Exception as err:
        return {"type": type(err).__name__, "message": str(err)}
    return {"type": None, "message": ""}


# ---------------------------------------------------------------------------------------------- two ranks
def train_and_save(fabric: Any, folder: str) -> dict[str, Any]:
    """Parity with DDP, sharding, no_backward_sync, meta-device init, misuse, and the checkpoints the
    load jobs read (on 1 and 3 ranks)."""
    root = Path(folder)
    rank = fabric.global_rank
    shared: dict[str, Any] = {}

    def parity() -> dict[str, Any]:
        torch.manual_seed(0)
        model = Net()
        reference = DistributedDataParallel(copy.deepcopy(model))
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
        fmodel = fabric.setup_module(model)
        foptimizer = fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=LR, momentum=0.9))
        losses, norms, ref_losses, ref_norms = [], [], [], []
        for step in range(STEPS):
            loss, norm = train_step(fabric, fmodel, foptimizer, step)
            losses.append(loss)
            norms.append(norm)
            x, y = rank_batch(fabric, step)
            ref_loss = nn.functional.mse_loss(reference(x), y)
            ref_optimizer.zero_grad()
            ref_loss.backward()
            ref_norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM).item())
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        shared.update(fmodel=fmodel, foptimizer=foptimizer, reference=reference, ref_optimizer=ref_optimizer)
        return {
            "losses": losses,
            "ref_losses": ref_losses,
            "norms": norms,
            "ref_norms": ref_norms,
            "param_difference": max_difference(full_model_state(fmodel), reference.module.state_dict()),
        }

    def joint_setup() -> dict[str, Any]:
        """fabric.setup(model, optimizer), the optimizer created before sharding: the same steps as setup_module with
        the optimizer created afterwards."""
        torch.manual_seed(3)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        fmodel, foptimizer = fabric.setup(model, optimizer)
        ref_model, ref_optimizer = setup_model(fabric, seed=3)
        steps = [train_step(fabric, fmodel, foptimizer, step) for step in range(3)]
        ref_steps = [train_step(fabric, ref_model, ref_optimizer, step) for step in range(3)]
        return {
            "steps": steps,
            "ref_steps": ref_steps,
            "param_difference": max_difference(full_model_state(fmodel), full_model_state(ref_model)),
            "optimizer_holds_the_model": [id(p) for p in foptimizer.param_groups[0]["params"]]
            == [id(p) for p in fmodel.parameters()],
        }

    def sharding() -> dict[str, Any]:
        from torch.distributed.tensor import DTensor

        params = list(shared["fmodel"].parameters())
        return {
            "all_dtensors": all(isinstance(p, DTensor) for p in params),
            "local": sum(p.to_local().numel() for p in params),
            "total": sum(p.numel() for p in params),
            "units": fsdp_units(shared["fmodel"].module),
        }

    def no_sync() -> dict[str, Any]:
        torch.manual_seed(1)
        model = Net()
        reference = DistributedDataParallel(copy.deepcopy(model))
        fmodel = fabric.setup_module(model)
        for micro in range(3):
            last = micro == 2
            x, y = rank_batch(fabric, 20 + micro)
            with fabric.no_backward_sync(fmodel, enabled=not last):
                fabric.backward(nn.functional.mse_loss(fmodel(x), y))
            context = reference.no_sync() if not last else torch.enable_grad()
            with context:
                nn.functional.mse_loss(reference(x), y).backward()
        grads = {n: p.grad.full_tensor() for n, p in fmodel.module.named_parameters()}
        ref_grads = {n: p.grad for n, p in reference.module.named_parameters()}
        return {"grad_difference": max_difference(grads, ref_grads)}

    def meta_init() -> dict[str, Any]:
        torch.manual_seed(0)
        eager = InitNet()
        eager_state = {k: v.detach().clone() for k, v in eager.state_dict().items()}
        rng_after_eager = torch.random.get_rng_state()
        torch.manual_seed(0)
        with fabric.init_module(empty_init=True):
            model = InitNet()
        on_meta = all(t.is_meta for t in [*model.parameters(), *model.buffers()])
        fmodel = fabric.setup_module(model)
        state = full_model_state(fmodel)
        tokens = torch.arange(8) % 10
        return {
            "on_meta": on_meta,
            "keys_match": sorted(state) == sorted(eager_state),
            "difference": max_difference(state, eager_state),
            "rng_as_after_eager": torch.equal(torch.random.get_rng_state(), rng_after_eager),
            "still_tied": fmodel.module.head.weight is fmodel.module.embed.weight,
            "forward_finite": bool(torch.isfinite(fmodel(tokens)).all()),
        }

    def misuse() -> dict[str, Any]:
        def stepped_optimizer_joint() -> None:
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            model(torch.ones(2, 6)).sum().backward()
            optimizer.step()
            fabric.setup(model, optimizer)

        def optimizer_first() -> None:
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            fabric.setup_module(model)
            fabric.setup_optimizers(optimizer)

        def meta_without_reset() -> dict[str, Any]:
            with fabric.init_module(empty_init=True):
                model = NoReset()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fmodel = fabric.setup_module(model)
            return {
                "warnings": [str(w.message) for w in caught],
                "on_meta": [n for n, t in [*fmodel.named_parameters(), *fmodel.named_buffers()] if t.is_meta],
                "lin_finite": bool(torch.isfinite(fmodel.module.lin.weight.full_tensor()).all()),
            }

        not_a_checkpoint = root / "not_a_checkpoint"
        if rank == 0:
            not_a_checkpoint.mkdir()
            (not_a_checkpoint / "notes.txt").write_text("keep me")
        fabric.barrier()
        fmodel = shared["fmodel"]
        result = {
            "stepped_joint_setup": error_of(stepped_optimizer_joint),
            "optimizer_first": error_of(optimizer_first),
            "meta_without_reset": meta_without_reset(),
            "load_plain_folder": error_of(lambda: fabric.load(not_a_checkpoint, {"model": fmodel})),
            "save_over_plain_folder": error_of(lambda: fabric.save(not_a_checkpoint, {"model": fmodel})),
            "load_missing": error_of(lambda: fabric.load(root / "missing", {"model": fmodel})),
            "no_sync_unsharded": error_of(lambda: fabric.strategy.no_backward_sync(nn.Linear(2, 2))),
        }
        result["plain_folder_kept"] = sorted(p.name for p in not_a_checkpoint.iterdir())
        result["after"] = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()  # still in step
        return result

    def save() -> dict[str, Any]:
        fmodel, foptimizer = shared["fmodel"], shared["foptimizer"]
        reference, ref_optimizer = shared["reference"], shared["ref_optimizer"]
        state = {"model": fmodel, "optimizer": foptimizer, "step": 10, "extra": {"note": "hi"}, "counter": Counter(7)}
        fabric.save(root / "sharded", state)
        files_on_return = sorted(p.name for p in (root / "sharded").iterdir())
        fabric.strategy.state_dict_type = "full"
        try:
            fabric.save(root / "full.ckpt", state)
        finally:
            fabric.strategy.state_dict_type = "sharded"
        full_file_on_return = (root / "full.ckpt").is_file()
        # the reference, through torch's own APIs, and a DDP checkpoint as DDPStrategy writes it (optimizer state
        # keyed by position)
        expected = {"model": full_model_state(fmodel), "optimizer": full_optimizer_state(fmodel, foptimizer)}
        if rank == 0:
            torch.save(expected, root / "expected.pt")
            ddp = {"model": reference.module.state_dict(), "optimizer": ref_optimizer.state_dict(), "step": 10}
            torch.save(ddp, root / "ddp.ckpt")
        # where one more step leads, for the load jobs to compare with at their world size
        train_step(fabric, fmodel, foptimizer, STEPS)
        next_state = full_model_state(fmodel)
        if rank == 0:
            torch.save(next_state, root / "next.pt")
        fabric.barrier()
        leftovers = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
        # every rank lists the folder before any rank goes on to the next check's saves (whose temporary folders
        # would otherwise show up here)
        fabric.barrier()
        return {"files_on_return": files_on_return, "full_file_on_return": full_file_on_return, "leftovers": leftovers}

    def replace_and_fail() -> dict[str, Any]:
        fmodel = shared["fmodel"]
        target = root / "replaced"
        fabric.save(target, {"model": fmodel, "step": 1})
        fabric.save(target, {"model": fmodel, "step": 2})  # replaces the previous checkpoint
        step_after_replace = fabric.load(target, {"step": 0}, strict=False)
        metadata_before = (target / ".metadata").read_bytes()
        failure = error_of(lambda: fabric.save(target, {"model": fmodel, "step": 3, "bad": Unpicklable()}))
        fabric.barrier()
        loaded = {"step": 0}
        fabric.load(target, loaded)
        return {
            "step_after_replace": (step_after_replace, loaded["step"]),
            "failure": failure,
            "previous_intact": (target / ".metadata").read_bytes() == metadata_before,
            "leftovers": sorted(p.name for p in root.iterdir() if p.name.startswith(".")),
            "after": fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item(),
        }

    def metadata_file() -> dict[str, Any]:
        return error_of(lambda: fabric.load(root / "sharded" / ".metadata", {"model": shared["fmodel"]}))

    return record(
        {
            "parity": parity,
            "joint_setup": joint_setup,
            "sharding": sharding,
            "no_sync": no_sync,
            "meta_init": meta_init,
            "misuse": misuse,
            "save": save,
            "replace_and_fail": replace_and_fail,
            "metadata_file": metadata_file,
        }
    )


# ---------------------------------------------------------------------------------------------- any world size
def load_and_continue(fabric: Any, folder: str) -> dict[str, Any]:
    """Load what train_and_save wrote on two ranks (sharded, full, consolidated, DDP) at this world size."""
    root = Path(folder)
    expected = torch.load(root / "expected.pt", weights_only=True)
    next_state = torch.load(root / "next.pt", weights_only=True)

    def load(name: str) -> dict[str, Any]:
        fmodel, foptimizer = setup_model(fabric, seed=123)
        counter = Counter(0)
        state = {"model": fmodel, "optimizer": foptimizer, "step": 0, "counter": counter}
        if name == "ddp.ckpt":
            del state["counter"]
        remainder = fabric.load(root / name, state)
        optimizer_state = full_optimizer_state(fmodel, foptimizer)
        momentum = {k: v["momentum_buffer"] for k, v in optimizer_state["state"].items()}
        if name == "ddp.ckpt":
            ddp = torch.load(root / name, weights_only=True)
            names = [n for n, _ in Net().named_parameters()]
            expected_model = ddp["model"]
            expected_momentum = {names[i]: s["momentum_buffer"] for i, s in ddp["optimizer"]["state"].items()}
        else:
            expected_model = expected["model"]
            expected_momentum = {k: v["momentum_buffer"] for k, v in expected["optimizer"]["state"].items()}
        observation = {
            "model_difference": max_difference(full_model_state(fmodel), expected_model),
            "momentum_difference": max_difference(momentum, expected_momentum),
            "step": state["step"],
            "counter": counter.value,
            "remainder": remainder,
            "wrappers_kept": state["model"] is fmodel and state["optimizer"] is foptimizer,
        }
        if name != "ddp.ckpt":
            train_step(fabric, fmodel, foptimizer, STEPS)
            observation["next_difference"] = max_difference(full_model_state(fmodel), next_state)
        return observation

    def everything() -> dict[str, Any]:
        whole = fabric.load(root / "sharded")
        return {"keys": sorted(whole), "step": whole["step"], "model_keys": sorted(whole["model"])}

    def strictness() -> dict[str, Any]:
        fmodel, foptimizer = setup_model(fabric, seed=5)
        state = {"model": fmodel, "optimizer": foptimizer, "absent": 1}
        strict_error = error_of(lambda: fabric.load(root / "sharded", state))
        remainder = fabric.load(root / "sharded", state, strict=False)
        return {
            "strict_error": strict_error,
            "remainder": remainder,
            "absent_kept": state["absent"],
            "model_difference": max_difference(full_model_state(fmodel), expected["model"]),
        }

    checks: dict[str, Callable[[], Any]] = {
        name: (lambda name=name: load(name)) for name in ("sharded", "full.ckpt", "consolidated.pt", "ddp.ckpt")
    }
    checks.update(everything=everything, strictness=strictness)
    return {"world_size": fabric.world_size, **record(checks)}


# ---------------------------------------------------------------------------------------------- options
def options(fabric: Any) -> dict[str, Any]:
    """16-mixed with a sharded loss scaler, activation checkpointing, CPU offload and a size-based wrap policy."""
    from torch.distributed.tensor import DTensor

    rank = fabric.global_rank
    torch.manual_seed(0)
    model = Net()
    reference = DistributedDataParallel(copy.deepcopy(model))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    seen: list[tuple[str, str]] = []
    model.blocks[0].fc1.register_forward_hook(lambda m, i, o: seen.append((str(m.weight.dtype), str(o.dtype))))
    fmodel = fabric.setup_module(model)
    foptimizer = fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=LR))

    def training() -> dict[str, Any]:
        losses, ref_losses = [], []
        for step in range(3):
            x, y = rank_batch(fabric, step)
            loss = nn.functional.mse_loss(fmodel(x), y)
            foptimizer.zero_grad()
            fabric.backward(loss)
            foptimizer.step()
            losses.append(loss.item())
            ref_loss = nn.functional.mse_loss(reference(x), y)
            ref_optimizer.zero_grad()
            ref_loss.backward()
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        param = next(iter(fmodel.parameters()))
        return {
            "losses": losses,
            "ref_losses": ref_losses,
            "forward_calls_per_step": len(seen) / 3,
            "compute_dtypes": sorted(set(seen)),
            "shard_dtype": str(param.dtype),
            "shard_device": str(param.to_local().device),
            "grad_is_sharded_fp32": isinstance(param.grad, DTensor) and param.grad.dtype == torch.float32,
            "units": fsdp_units(fmodel.module),
            "scaler": type(fabric.strategy.precision.scaler).__name__,
        }

    def skipped_step_agreed() -> dict[str, Any]:
        """A non-finite gradient in rank 1's shard only: every rank must skip the step and lower the scale."""
        before = full_model_state(fmodel)
        scale_before = fabric.strategy.precision.scaler.get_scale()
        x, y = rank_batch(fabric, 5)
        foptimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(fmodel(x), y))
        if rank == 1:
            with torch.no_grad():
                next(iter(fmodel.parameters())).grad.to_local().view(-1)[0] = float("inf")
        foptimizer.step()
        return {
            "unchanged": max_difference(full_model_state(fmodel), before),
            "scale": (scale_before, fabric.strategy.precision.scaler.get_scale()),
        }

    return record({"training": training, "skipped_step_agreed": skipped_step_agreed})


# ---------------------------------------------------------------------------------------------- sharding strategies
def sharding_strategies(fabric: Any, folder: str) -> dict[str, Any]:
    """Train with the strategy's ``sharding_strategy`` (and ``device_mesh``) beside a reference sharded by torch's
    ``fully_shard`` directly, over a 1-D mesh of all ranks (plain FULL_SHARD), then save and load a checkpoint."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    root = Path(folder)
    shared: dict[str, Any] = {}

    def training() -> dict[str, Any]:
        torch.manual_seed(0)
        model = Net()
        reference = copy.deepcopy(model)
        flat = init_device_mesh("cpu", (fabric.world_size,))
        for block in reference.blocks:
            fully_shard(block, mesh=flat)
        fully_shard(reference, mesh=flat)
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
        fmodel = fabric.setup_module(model)
        foptimizer = fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=LR, momentum=0.9))
        losses, norms, ref_losses, ref_norms = [], [], [], []
        gathered_after_forward = []
        for step in range(STEPS):
            x, y = rank_batch(fabric, step)
            loss = nn.functional.mse_loss(fmodel(x), y)
            # a block's parameters are plain tensors while gathered, DTensors (shards) once resharded
            gathered_after_forward.append(not isinstance(fmodel.module.blocks[0].fc1.weight, DTensor))
            foptimizer.zero_grad()
            fabric.backward(loss)
            norms.append(fabric.clip_gradients(fmodel, foptimizer, max_norm=MAX_NORM).item())
            foptimizer.step()
            losses.append(loss.item())
            ref_loss = nn.functional.mse_loss(reference(x), y)
            ref_optimizer.zero_grad()
            ref_loss.backward()
            ref_norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM).full_tensor().item())
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        shared.update(fmodel=fmodel, foptimizer=foptimizer)
        mesh = fabric.strategy.device_mesh
        params = list(fmodel.parameters())
        return {
            "losses": losses,
            "ref_losses": ref_losses,
            "norms": norms,
            "ref_norms": ref_norms,
            "param_difference": max_difference(
                full_model_state(fmodel),
                get_model_state_dict(reference, options=StateDictOptions(full_state_dict=True)),
            ),
            "gathered_after_forward": gathered_after_forward,
            "mesh": (tuple(mesh.shape), mesh.mesh_dim_names),
            "placements": sorted({str(p.placements) for p in params}),
            "local": sum(p.to_local().numel() for p in params),
            "total": sum(p.numel() for p in params),
        }

    def checkpoint() -> dict[str, Any]:
        fmodel, foptimizer = shared["fmodel"], shared["foptimizer"]
        expected = full_model_state(fmodel)
        expected_momentum = full_optimizer_state(fmodel, foptimizer)["state"]
        fabric.save(root / "sharded", {"model": fmodel, "optimizer": foptimizer, "step": 10})
        fabric.strategy.state_dict_type = "full"
        try:
            fabric.save(root / "full.ckpt", {"model": fmodel, "optimizer": foptimizer, "step": 10})
        finally:
            fabric.strategy.state_dict_type = "sharded"
        result = {}
        for name in ("sharded", "full.ckpt"):
            model, optimizer = setup_model(fabric, seed=123)
            state = {"model": model, "optimizer": optimizer, "step": 0}
            fabric.load(root / name, state)
            momentum = full_optimizer_state(model, optimizer)["state"]
            result[name] = {
                "model_difference": max_difference(full_model_state(model), expected),
                "momentum_difference": max(
                    (momentum[k]["momentum_buffer"] - v["momentum_buffer"]).abs().max().item()
                    for k, v in expected_momentum.items()
                ),
                "step": state["step"],
            }
        return result

    return record({"training": training, "checkpoint": checkpoint})


# ---------------------------------------------------------------------------------------------- fsspec URLs
def sharded_on_url(fabric: Any, url: str, load_only: bool = False) -> dict[str, Any]:
    """Sharded checkpoints on an fsspec URL (``memory://`` on one rank, ``s3://`` on two): save, replace, a failed
    save that keeps the previous one, load into a fresh model, the whole checkpoint, and what is left in the folder.
    With ``load_only``, load ``url/ckpt`` saved by a run at another world size and report the parameters, then
    consolidate it into ``url/full.ckpt`` and report what that holds (in this process: one spawn fewer)."""
    from fabric_lite.utilities.cloud_io import get_filesystem

    target = f"{url}/ckpt"
    fs = get_filesystem(url)

    def listing() -> list[str]:
        return sorted(path.rsplit("/", 1)[-1] for path in fs.find(url))

    def load_fresh() -> dict[str, Any]:
        fresh, fresh_opt = setup_model(fabric, seed=99)
        state = {"model": fresh, "optimizer": fresh_opt, "counter": Counter(0), "step": 0}
        remainder = fabric.load(target, state)
        return {
            "model": full_model_state(fresh),
            "optimizer": full_optimizer_state(fresh, fresh_opt),
            "counter": state["counter"].value,
            "step": state["step"],
            "remainder": sorted(remainder),
        }

    def consolidated() -> dict[str, Any]:
        from fabric_lite.runtime.checkpoint import safe_load
        from fabric_lite.utilities.consolidate import main

        if main([target, "--output_file", f"{url}/full.ckpt"]) != 0:
            raise RuntimeError(f"consolidating {target} failed (its message is on stderr)")
        full = safe_load(f"{url}/full.ckpt")
        return {"keys": sorted(full), "step": full["step"], "counter": full["counter"]}

    if load_only:
        return record({"loaded": lambda: {"model": load_fresh()["model"]}, "consolidated": consolidated})
    fmodel, foptimizer = setup_model(fabric, seed=1)
    results: dict[str, Any] = {}

    def save_and_replace() -> dict[str, Any]:
        for step in range(2):
            train_step(fabric, fmodel, foptimizer, step)
        fabric.save(target, {"model": fmodel, "optimizer": foptimizer, "counter": Counter(2), "step": 2})
        first = listing()
        train_step(fabric, fmodel, foptimizer, 2)
        fabric.save(target, {"model": fmodel, "optimizer": foptimizer, "counter": Counter(3), "step": 3})
        fabric.barrier()
        return {"first": first, "replaced": listing()}

    results["save"] = save_and_replace
    results["failed_save"] = lambda: error_of(
        lambda: fabric.save(target, {"model": fmodel, "step": 4, "bad": Unpicklable()})
    )
    results["after_failure"] = lambda: {"files": (fabric.barrier(), listing())[1], **load_fresh()}
    results["expected"] = lambda: {
        "model": full_model_state(fmodel),
        "optimizer": full_optimizer_state(fmodel, foptimizer),
    }
    results["whole"] = lambda: sorted(fabric.load(target))
    results["not_a_checkpoint"] = lambda: error_of(lambda: fabric.load(f"{url}/nothing-here", {"model": fmodel}))
    return record(results)


# ---------------------------------------------------------------------------------------------- FSDP1's arguments
def fsdp1_arguments(fabric: Any) -> dict[str, Any]:
    """Lightning's FSDP1 arguments mapped onto ``fully_shard``, on two ranks. Run through the DDP job runner
    (``tests.helpers.jobs._runner``): a ``process_group`` must exist before ``FSDPStrategy(...)`` is made, so each
    check builds a ``Fabric`` inside the running job, as a script started by torchrun with its own groups would
    (the launcher's variables set, the default group reused)."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import BackwardPrefetch, FSDPModule
    from torch.distributed.tensor import DTensor

    from fabric_lite.strategies.fsdp import _get_full_state_dict_context

    rank = dist.get_rank()
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2", NODE_RANK="0")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # read, never bound: the group exists
    world = dist.new_group([0, 1])
    singles = [dist.new_group([0]), dist.new_group([1])]  # every rank takes part in making every group

    def inner(**kwargs: Any) -> Any:
        strategy = FSDPStrategy(timeout=timedelta(seconds=60), **kwargs)
        inner_fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
        inner_fabric.launch()
        return inner_fabric

    def losses(inner_fabric: Any, **kwargs: Any) -> list[float]:
        torch.manual_seed(0)
        fmodel = inner_fabric.setup_module(Net())
        foptimizer = inner_fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=LR))
        return [train_step(inner_fabric, fmodel, foptimizer, step)[0] for step in range(3)]

    def sync_module_states() -> dict[str, Any]:
        """Ranks seeded differently start from rank 0's values, built eagerly or on the meta device."""
        inner_fabric = inner(process_group=world, sync_module_states=True)
        torch.manual_seed(0)
        expected = Net().state_dict()
        torch.manual_seed(rank)
        eager = inner_fabric.setup_module(Net())
        torch.manual_seed(rank)
        with inner_fabric.init_module(empty_init=True):
            meta = Net()
        meta = inner_fabric.setup_module(meta)
        return {
            "mesh": (inner_fabric.strategy.device_mesh.mesh_dim_names, inner_fabric.strategy.device_mesh.size()),
            "eager": max_difference(full_model_state(eager), expected),
            "meta": max_difference(full_model_state(meta), expected),
        }

    def hybrid_pair() -> dict[str, Any]:
        """``(shard, replicate)`` groups make a ("replicate", "shard") mesh; one replica of two shards trains as
        FULL_SHARD does."""
        pair = inner(sharding_strategy="HYBRID_SHARD", process_group=(world, singles[rank]))
        mesh = pair.strategy.device_mesh
        return {
            "mesh": (mesh.mesh_dim_names, tuple(mesh.shape)),
            "losses": losses(pair),
            "full_shard": losses(inner(auto_wrap_policy=None)),
        }

    def ignored_and_prefetch() -> dict[str, Any]:
        """``ignored_modules`` stay whole (plain tensors); ``forward_prefetch`` chains the units; the no-op flags
        are taken; training equals the plain strategy's where nothing is ignored."""
        options = {
            "limit_all_gathers": True,
            "use_orig_params": False,
            "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
        }
        prefetching = inner(auto_wrap_policy={Block}, forward_prefetch=True, **options)
        torch.manual_seed(0)
        fmodel = prefetching.setup_module(Net())
        units = [m for m in fmodel.module.modules() if isinstance(m, FSDPModule)]
        chained = [len(unit._get_fsdp_state()._states_to_forward_prefetch) for unit in units]
        torch.manual_seed(0)
        model = Net()
        ignoring = inner(ignored_modules=[model.out], ignored_states=[model.inp.bias])
        fignored = ignoring.setup_module(model)
        kinds = {name: isinstance(p, DTensor) for name, p in fignored.module.named_parameters()}
        return {
            "chained": chained,
            "losses": losses(prefetching),
            "plain": losses(inner(auto_wrap_policy={Block})),
            "dtensors": sorted(name for name, is_dtensor in kinds.items() if is_dtensor),
            "whole": sorted(name for name, is_dtensor in kinds.items() if not is_dtensor),
        }

    def full_state_dict_context() -> dict[str, Any]:
        """Lightning's ``_get_full_state_dict_context``: inside, ``state_dict()`` gives rank 0 the whole tensors."""
        inner_fabric = inner()
        torch.manual_seed(0)
        fmodel = inner_fabric.setup_module(Net())
        reference = full_model_state(fmodel)  # on every rank: gathering is collective
        with _get_full_state_dict_context(fmodel.module, world_size=2):
            state = fmodel.module.state_dict()
        with _get_full_state_dict_context(fmodel.module, world_size=2, rank0_only=False):
            everywhere = fmodel.module.state_dict()
        return {
            "keys": len(state),
            "difference": max_difference(state, reference) if state else None,
            "plain": all(type(v) is torch.Tensor and v.device.type == "cpu" for v in everywhere.values()),
            "after": isinstance(next(iter(fmodel.module.state_dict().values())), DTensor),
        }

    return record(
        {
            "sync_module_states": sync_module_states,
            "hybrid_pair": hybrid_pair,
            "ignored_and_prefetch": ignored_and_prefetch,
            "full_state_dict_context": full_state_dict_context,
        }
    )


# ---------------------------------------------------------------------------------------------- runner
def _strategy(spec: Any) -> Any:
    if isinstance(spec, str):
        return spec
    kwargs = dict(spec)
    for key in ("auto_wrap_policy", "activation_checkpointing_policy"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = {CLASSES[name] for name in kwargs[key]}
    if isinstance(kwargs.get("device_mesh"), list):  # JSON has no tuples
        kwargs["device_mesh"] = tuple(kwargs["device_mesh"])
    return FSDPStrategy(timeout=timedelta(seconds=60), **kwargs)


def make_fabric(nprocs: int, spec: dict[str, Any]) -> Any:
    precision = spec.get("precision", "32-true")
    # float16 on the CPU needs the plugin (Fabric maps "16-mixed" to bf16 there); a small initial scale, so that
    # no step overflows and the losses can be held against float32
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)  # made a ShardedGradScaler by FSDPStrategy
    plugins = [FSDPPrecision("16-mixed", scaler=scaler)] if precision == "16-mixed" else None  # type: ignore[arg-type]
    return Fabric(
        accelerator="cpu",
        devices=nprocs,
        strategy=_strategy(spec.get("strategy", "fsdp")),
        precision=None if plugins else precision,
        plugins=plugins,
    )


def main() -> None:
    serve(make_fabric, lambda fabric, spec: globals()[spec["job"]](fabric, **spec.get("kwargs", {})))


if __name__ == "__main__":
    main()
