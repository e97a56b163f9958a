"""ModelParallelStrategy jobs, run on real gloo process groups on the CPU by tests/distributed/test_model_parallel.py.

    python -m tests.helpers.jobs.model_parallel_jobs JOB NPROCS OPTIONS_JSON OUT_PATH
    python -m tests.helpers.jobs.model_parallel_jobs series NPROCS '[OPTIONS, ...]' OUT_PATH

``OPTIONS_JSON`` holds the strategy's sizes (``dp``, ``tp``, ``replicate``, each ``"auto"`` or an int), the parallelize
options (``sequence_parallel``, ``loss_parallel``, ``activation_checkpointing``, and ``mp_policy``: pass the strategy's
``mixed_precision_policy`` to ``fully_shard``), ``precision``, ``save_distributed_checkpoint``, the optimizer's
``foreach``, ``compile`` (a backend), ``accumulate`` (micro-batches per step) and the job's ``kwargs``. ``Fabric(...,
devices=NPROCS)`` re-runs this module once per extra rank; every rank runs ``JOB(fabric, options, **kwargs)`` and rank 0
pickles the list of every rank's result to ``OUT_PATH``. A ``series`` runs several jobs in one launch, one after
another, each entry's options naming its ``job`` and its ``name`` (the key of its result). The model is a tiny
Llama-style transformer with the names that ``fabric_lite.strategies.parallelize.TransformerPlan`` expects by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tests.helpers.jobs.checks import record
from tests.helpers.jobs.fsdp_jobs import Unpicklable, error_of

VOCAB, DIM, HEADS, HIDDEN, DEPTH, SEQ = 32, 16, 4, 32, 2, 8
GLOBAL_BATCH = 8  # divides over 1, 2 and 4 data-parallel ranks
SAMPLES = 96
STEPS = 10
LR = 0.02
MAX_NORM = 0.5


# ---------------------------------------------------------------------------------------------- the model
class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, depth: int = DEPTH) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(depth)])
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask)
        return self.output(self.norm(h))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class ResidualMLP(nn.Module):
    """A stack of residual MLP blocks and a linear head, for a ``split_fn`` written by hand (:func:`split_mlp`)."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Residual() for _ in range(depth)])
        self.head = nn.Linear(DIM, 1)
        self.wrong_split = False  # split_mlp returns one module too many: the strategy must refuse it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def split_mlp(model: nn.Module, stages: list[int], num_stages: int) -> list[nn.Module]:
    """The manual route: each stage a ``ResidualMLP`` of its own holding the model's blocks under their names (an
    ``nn.Sequential`` keyed ``"2"``, ``"3"``, ...), the head on the last stage and ``Dropped`` elsewhere."""
    from collections import OrderedDict

    from fabric_lite.strategies.parallelize import Dropped

    assert isinstance(model, ResidualMLP)
    per_stage = len(model.blocks) // num_stages
    parts: list[nn.Module] = []
    for stage in stages:
        part = ResidualMLP(depth=0)
        kept = range(stage * per_stage, (stage + 1) * per_stage)
        part.blocks = nn.Sequential(OrderedDict((str(i), model.blocks[i]) for i in kept))
        part.head = model.head if stage == num_stages - 1 else Dropped()  # type: ignore[assignment]
        parts.append(part)
    return [*parts, model] if model.wrong_split else parts


def points(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` global batches of inputs and regression targets."""
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(steps * GLOBAL_BATCH, DIM, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def mlp_reference(steps: int, microbatches: int) -> dict[str, Any]:
    """``ResidualMLP`` in one process over the global batches, the gradient accumulated over ``microbatches``."""
    torch.manual_seed(0)
    model = ResidualMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    inputs, targets = points(steps)
    losses = []
    for step in range(steps):
        window = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        optimizer.zero_grad()
        parts = [
            F.mse_loss(model(x), y)
            for x, y in zip(inputs[window].chunk(microbatches), targets[window].chunk(microbatches), strict=True)
        ]
        torch.autograd.backward(parts)
        for param in model.parameters():
            param.grad /= microbatches  # type: ignore[operator]
        optimizer.step()
        losses.append(torch.stack(parts).mean().item())
    return {"losses": losses, "state": {k: v.clone() for k, v in model.state_dict().items()}}


class Tokens(Dataset[torch.Tensor]):
    """``SAMPLES`` fixed random sequences of ``SEQ + 1`` tokens (input and next-token target)."""

    def __init__(self) -> None:
        self.data = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def loss_of(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


# ---------------------------------------------------------------------------------------------- reference
def reference(steps: int = STEPS, depth: int = DEPTH, microbatches: int = 1) -> dict[str, Any]:
    """The same model, data and optimizer in one process over the global batch: what every layout must match. With
    ``microbatches``, the gradient is accumulated over that many parts of the batch and divided by their number, as a
    pipeline schedule does (the same value, summed in another order)."""
    torch.manual_seed(0)
    model = Llama(depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    data = Tokens()
    losses, norms = [], []
    for step in range(steps):
        batch = data.data[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
        optimizer.zero_grad()
        if microbatches > 1:
            parts = [loss_of(model(part[:, :-1]), part) for part in batch.chunk(microbatches)]
            torch.autograd.backward(parts)
            for param in model.parameters():
                param.grad /= microbatches  # type: ignore[operator]
            loss = torch.stack(parts).detach().mean()
        else:
            loss = loss_of(model(batch[:, :-1]), batch)
            loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms, "state": {k: v.clone() for k, v in model.state_dict().items()}}


# ---------------------------------------------------------------------------------------------- helpers
def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in state.items()}


def placements(module: nn.Module) -> dict[str, Any]:
    """For every parameter: its placements and the fraction of its elements this rank holds."""
    from torch.distributed.tensor import DTensor

    found = {}
    for name, param in module.named_parameters():
        if isinstance(param, DTensor):
            found[name] = {
                "placements": [str(p) for p in param.placements],
                "mesh": list(param.device_mesh.mesh_dim_names or ()),
                "fraction": param.to_local().numel() / param.numel(),
            }
        else:
            found[name] = {"placements": None, "mesh": None, "fraction": 1.0}
    return found


def local_digests(module: nn.Module) -> dict[str, str]:
    """A digest of the part of every parameter this rank holds (to compare replicas without sending tensors)."""
    from torch.distributed.tensor import DTensor

    digests = {}
    for name, param in module.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        digests[name] = hashlib.sha1(local.detach().float().numpy().tobytes()).hexdigest()[:16]
    return digests


def gradient_sync_flags(module: nn.Module) -> list[bool]:
    """Whether each ``fully_shard`` unit of ``module`` reduces its gradients in the next backward (FSDP2's state)."""
    from torch.distributed.fsdp import FSDPModule

    return [
        group.reduce_grads
        for unit in module.modules()
        if isinstance(unit, FSDPModule)
        for group in unit._get_fsdp_state()._fsdp_param_groups
    ]


@contextmanager
def counting_reduce_scatters() -> Iterator[list[int]]:
    """Count the calls of ``torch.distributed``'s reduce-scatters (FSDP2 reduces its gradients with them; tensor
    parallelism uses the functional collectives, which are not counted). Yields a one-element list, the count."""
    import torch.distributed as dist

    count = [0]
    names = [name for name in ("reduce_scatter_tensor", "reduce_scatter_single") if hasattr(dist, name)]
    originals = {name: getattr(dist, name) for name in names}

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(*args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(dist, name, counted(original))
    try:
        yield count
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def watch_blocks(module: nn.Module) -> tuple[list[int], set[str]]:
    """Hooks on every block's MLP: how often it runs (activation checkpointing runs it again in backward) and the
    dtypes of its weights while it runs (FSDP2's ``param_dtype`` once the unit is gathered)."""
    calls, dtypes = [0], set()

    def hook(mlp: nn.Module, args: Any) -> None:
        calls[0] += 1
        dtypes.add(str(mlp.w1.weight.dtype))

    for block in module.layers:
        block.feed_forward.register_forward_pre_hook(hook)
    return calls, dtypes


def _parallelize(options: dict[str, Any]) -> Callable[..., nn.Module]:
    from fabric_lite.strategies.parallelize import TransformerPlan, parallelize_transformer

    return partial(
        parallelize_transformer,
        plan=TransformerPlan(),
        sequence_parallel=options.get("sequence_parallel", True),
        loss_parallel=options.get("loss_parallel", False),
        activation_checkpointing=options.get("activation_checkpointing", False),
    )


def make_fabric(nprocs: int, options: dict[str, Any]) -> Any:
    from fabric_lite import Fabric
    from fabric_lite.strategies import ModelParallelStrategy

    def parallelize(model: nn.Module, device_mesh: Any) -> nn.Module:
        if options.get("split") == "mlp":  # the hand-written route: nothing to parallelise within a stage
            return model
        policy = strategy.mixed_precision_policy if options.get("mp_policy") else None
        return _parallelize(options)(model, device_mesh, mp_policy=policy)

    strategy = ModelParallelStrategy(
        parallelize,
        data_parallel_size=options.get("dp", "auto"),
        tensor_parallel_size=options.get("tp", "auto"),
        save_distributed_checkpoint=options.get("save_distributed_checkpoint", True),
        timeout=timedelta(seconds=90),
        data_parallel_replicate_size=options.get("replicate", 1),
        pipeline_parallel_size=options.get("pp", 1),
        pipeline_schedule=options.get("schedule", "1F1B"),
        pipeline_microbatches=options.get("microbatches"),
        split_fn=split_mlp if options.get("split") == "mlp" else None,
    )
    return Fabric(accelerator="cpu", devices=nprocs, strategy=strategy, precision=options.get("precision", "32-true"))


def setup(
    fabric: Any,
    seed: int = 0,
    empty_init: bool = True,
    compile_backend: str | None = None,
    foreach: bool | None = False,
    depth: int = DEPTH,
) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    with fabric.init_module(empty_init=empty_init):
        model = Llama(depth)
    model = fabric.setup_module(torch.compile(model, backend=compile_backend) if compile_backend else model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=LR, foreach=foreach))
    return model, optimizer


def step_loss(fabric: Any, model: Any, batch: torch.Tensor, loss_parallel: bool) -> torch.Tensor:
    from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_context

    if loss_parallel:
        with loss_parallel_context():
            loss = loss_of(model(batch[:, :-1]), batch)
            fabric.backward(loss)
        return loss
    loss = loss_of(model(batch[:, :-1]), batch)
    fabric.backward(loss)
    return loss


# ---------------------------------------------------------------------------------------------- jobs
def train(
    fabric: Any, options: dict[str, Any], folder: str | None = None, steps: int = STEPS, reload: bool = False
) -> dict[str, Any]:
    """Train ``steps`` steps from a meta-device init; record losses (averaged over the data-parallel group), the
    clipped norms, the batches each rank saw, the placements, how often the blocks ran, and save a checkpoint into
    ``folder`` (with ``reload``, load it back into a fresh model on the same mesh)."""
    strategy = fabric.strategy
    mesh = strategy.device_mesh
    dp_group = mesh["data_parallel"].get_group()
    model, optimizer = setup(fabric, compile_backend=options.get("compile"), foreach=options.get("foreach", False))
    # hooks inside compiled blocks would be traced into them: watch the eager runs only
    calls, forward_dtypes = watch_blocks(model.module) if not options.get("compile") else ([0], set())
    loader = fabric.setup_dataloaders(DataLoader(Tokens(), batch_size=GLOBAL_BATCH // mesh["data_parallel"].size()))
    losses, norms, seen, block_calls = [], [], [], []
    accumulate = options.get("accumulate", 1)
    no_sync: dict[str, Any] = {"reduce_scatters": [], "inside": [], "after": []}
    with counting_reduce_scatters() as reduce_scatters:
        for step, batch in enumerate(loader):
            if step == steps:
                break
            seen.append(hashlib.sha1(batch.numpy().tobytes()).hexdigest()[:12])
            calls_before = calls[0]
            optimizer.zero_grad()
            if accumulate > 1:  # micro-batches: no gradient reduce-scatter but for the last one
                parts = batch.chunk(accumulate)
                loss = torch.tensor(0.0)
                for index, part in enumerate(parts):
                    before = reduce_scatters[0]
                    with fabric.no_backward_sync(model, enabled=index < len(parts) - 1):
                        part_loss = loss_of(model(part[:, :-1]), part) / len(parts)
                        fabric.backward(part_loss)
                        no_sync["inside"].append(gradient_sync_flags(model.module))
                    no_sync["after"].append(gradient_sync_flags(model.module))
                    no_sync["reduce_scatters"].append(reduce_scatters[0] - before)
                    loss = loss + part_loss.detach()
            else:
                loss = step_loss(fabric, model, batch, options.get("loss_parallel", False))
            block_calls.append(calls[0] - calls_before)
            norms.append(fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM).item())
            optimizer.step()
            loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
            losses.append(fabric.all_reduce(loss.detach().clone(), group=dp_group, reduce_op="mean").item())
    if accumulate > 1:
        with fabric.no_backward_sync(model):
            with fabric.no_backward_sync(model):
                no_sync["nested_inner"] = gradient_sync_flags(model.module)
            no_sync["nested_after_inner"] = gradient_sync_flags(model.module)
        no_sync["nested_after_outer"] = gradient_sync_flags(model.module)
    result: dict[str, Any] = {
        "rank": fabric.global_rank,
        "mesh": {name: mesh[name].get_local_rank() for name in mesh.mesh_dim_names},
        "mesh_shape": {"names": list(mesh.mesh_dim_names), "shape": list(mesh.shape)},
        "block_calls": block_calls if not options.get("compile") else None,
        "forward_dtypes": sorted(forward_dtypes),
        "no_sync": no_sync,
        "local": local_digests(model.module),
        "foreach": [group["foreach"] for group in optimizer.param_groups],
        "losses": losses,
        "norms": norms,
        "seen": seen,
        "placements": placements(model.module),
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "compiled": {
            "wrapped": type(model._call).__name__ == "OptimizedModule",
            "blocks": sum(getattr(m, "_compiled_call_impl", None) is not None for m in model.module.modules()),
        },
        "sampler": strategy.distributed_sampler_kwargs,
        "state": full_state(model),
    }
    if options.get("foreach_errors"):
        # the same parameters, in one group that mixes DTensors with the plain norms
        result["foreach_errors"] = {
            "foreach": error_of(lambda: fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), foreach=True))),
            "fused": error_of(lambda: fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), fused=True))),
        }
    if folder is not None:
        fabric.save(folder, {"model": model, "optimizer": optimizer, "step": steps})
        result["saved_files"] = sorted(p.name for p in Path(folder).iterdir()) if Path(folder).is_dir() else "file"
    if reload:
        assert folder is not None
        fresh, fresh_optimizer = setup(fabric, seed=123)
        restored = {"model": fresh, "optimizer": fresh_optimizer, "step": 0}
        remainder = fabric.load(folder, restored)
        result["reloaded"] = {
            "remainder": sorted(remainder),
            "step": restored["step"],
            "state": full_state(fresh),
            "placements": placements(fresh.module),
            "optimizer_steps": sorted({int(s["step"]) for s in fresh_optimizer.state.values()}),
        }
    return result


def load(fabric: Any, options: dict[str, Any], folder: str) -> dict[str, Any]:
    """Load ``folder`` into a fresh model (another mesh shape), check strictness and the remainder, and train one
    more step to show the optimizer state came back usable."""
    model, optimizer = setup(fabric, seed=123)
    state = {"model": model, "optimizer": optimizer, "step": 0}

    def load_all() -> dict[str, Any]:
        remainder = fabric.load(folder, state)
        return {"remainder": sorted(remainder), "step": state["step"], "state": full_state(model)}

    def strict() -> dict[str, Any]:
        return error_of(lambda: fabric.load(folder, {"model": model, "extra": 1}))

    def lenient() -> list[str]:
        return sorted(fabric.load(folder, {"model": model}, strict=False))

    def one_more_step() -> float:
        batch = Tokens().data[:GLOBAL_BATCH]
        loss = step_loss(fabric, model, batch, options.get("loss_parallel", False))
        optimizer.step()
        return float(loss.item())

    return record({"loaded": load_all, "strict": strict, "lenient": lenient, "step": one_more_step})


def misuse(fabric: Any, options: dict[str, Any], folder: str) -> dict[str, Any]:
    """Each misuse, recorded: an optimizer created before setup_module, setup with a stepped optimizer, a precision
    error is checked at construction by the test; here the ones that need a launched strategy, and a save that fails
    over a previous checkpoint (beside ``folder``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    def early_optimizer() -> dict[str, Any]:
        model = Llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stepped = Llama()
        adam = torch.optim.AdamW(stepped.parameters(), lr=LR)
        loss_of(stepped(Tokens().data[:2, :-1]), Tokens().data[:2]).backward()
        adam.step()
        return {
            "setup_stepped": error_of(lambda: fabric.setup(stepped, adam)),
            "setup_optimizers": error_of(lambda: (fabric.setup_module(model), fabric.setup_optimizers(optimizer))),
        }

    def joint_setup() -> dict[str, Any]:
        """fabric.setup(model, optimizer), the optimizer created before (over meta-device parameters): the same two
        steps as setup_module with the optimizer created afterwards."""
        batch = Tokens().data[:GLOBAL_BATCH]

        def two_steps(joint: bool) -> dict[str, Any]:
            torch.manual_seed(5)
            with fabric.init_module(empty_init=True):
                model = Llama()
            if joint:
                model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=LR, foreach=False))
            else:
                model = fabric.setup_module(model)
                optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=LR, foreach=False))
            losses = []
            for _ in range(2):
                optimizer.zero_grad()
                loss = step_loss(fabric, model, batch, options.get("loss_parallel", False))
                optimizer.step()
                losses.append((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item())
            return {"losses": losses, "local": local_digests(model.module)}

        return {"joint": two_steps(joint=True), "separate": two_steps(joint=False)}

    def fsdp1() -> dict[str, Any]:
        wrapped = nn.Sequential(FullyShardedDataParallel.__new__(FullyShardedDataParallel))
        return error_of(lambda: fabric.strategy.setup_module(wrapped))

    def no_sync() -> dict[str, Any]:
        return error_of(lambda: fabric.strategy.no_backward_sync(nn.Linear(2, 2)).__enter__())

    def bad_group_src() -> dict[str, Any]:
        tp = fabric.strategy.device_mesh["tensor_parallel"].get_group()
        others = [r for r in range(fabric.world_size) if r not in torch.distributed.get_process_group_ranks(tp)]
        return error_of(lambda: fabric.strategy.broadcast(1, src=others[0], group=tp))

    def group_collectives() -> dict[str, Any]:
        import torch.distributed as dist

        mesh = fabric.strategy.device_mesh
        tp, dp = mesh["tensor_parallel"].get_group(), mesh["data_parallel"].get_group()
        rank = torch.tensor(float(fabric.global_rank))
        tp_ranks, dp_ranks = dist.get_process_group_ranks(tp), dist.get_process_group_ranks(dp)
        fabric.barrier()
        fabric.strategy.barrier(group=tp)
        return {
            "world_sum": fabric.all_reduce(rank.clone(), reduce_op="sum").item(),
            "tp_sum": fabric.all_reduce(rank.clone(), group=tp, reduce_op="sum").item(),
            "dp_gather": fabric.all_gather(rank.clone(), group=dp).tolist(),
            "tp_broadcast": fabric.strategy.broadcast(fabric.global_rank, src=tp_ranks[0], group=tp),
            "tp_ranks": tp_ranks,
            "dp_ranks": dp_ranks,
        }

    def replace_and_fail() -> dict[str, Any]:
        root = Path(folder).parent
        target = root / "replaced"
        model = fabric.setup_module(Llama())
        fabric.save(target, {"model": model, "step": 1})
        fabric.save(target, {"model": model, "step": 2})  # swapped in over the first
        metadata_before = (target / ".metadata").read_bytes()
        files_before = sorted(p.name for p in target.iterdir())
        failure = error_of(lambda: fabric.save(target, {"model": model, "step": 3, "bad": Unpicklable()}))
        fabric.barrier()
        loaded = {"step": 0}
        fabric.load(target, loaded, strict=False)
        return {
            "failure": failure,
            "step": loaded["step"],
            "previous_intact": (target / ".metadata").read_bytes() == metadata_before,
            "files": (files_before, sorted(p.name for p in target.iterdir())),
            "leftovers": sorted(p.name for p in root.iterdir() if p.name.startswith(".")),
            "after": fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item(),
        }

    return record(
        {
            "early_optimizer": early_optimizer,
            "joint_setup": joint_setup,
            "fsdp1": fsdp1,
            "no_sync": no_sync,
            "bad_group_src": bad_group_src,
            "collectives": group_collectives,
            "replace_and_fail": replace_and_fail,
        }
    )


def pipeline_train(
    fabric: Any, options: dict[str, Any], folder: str | None = None, steps: int = STEPS, misuse: bool = False
) -> dict[str, Any]:
    """Train ``steps`` steps through ``fabric.pipeline_step`` (the loop of ``train`` with the step in one call); record
    the losses (averaged over the data-parallel group), clipped norms, batches seen, this rank's stages' full state and
    placements; save into ``folder`` and load it back into a fresh model on the same mesh; with ``misuse``, each misuse
    of a pipelined model."""
    strategy = fabric.strategy
    mesh = strategy.device_mesh
    dp = mesh["data_parallel"]
    depth = options.get("depth", DEPTH)
    model, optimizer = setup(fabric, depth=depth)
    loader = fabric.setup_dataloaders(DataLoader(Tokens(), batch_size=GLOBAL_BATCH // dp.size()))
    losses, norms, seen = [], [], []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        seen.append(hashlib.sha1(batch.numpy().tobytes()).hexdigest()[:12])
        optimizer.zero_grad()
        loss = fabric.pipeline_step(model, batch[:, :-1], target=batch, loss_fn=loss_of)
        norms.append(fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM).item())
        optimizer.step()
        losses.append(fabric.all_reduce(loss.clone(), group=dp.get_group(), reduce_op="mean").item())
    result: dict[str, Any] = {
        "rank": fabric.global_rank,
        "mesh": {name: mesh[name].get_local_rank() for name in mesh.mesh_dim_names},
        "mesh_shape": {"names": list(mesh.mesh_dim_names), "shape": list(mesh.shape)},
        "losses": losses,
        "norms": norms,
        "seen": seen,
        "placements": placements(model.module),
        "state": full_state(model),
        "module": type(model.module).__name__,
    }
    if folder is not None:
        fabric.save(folder, {"model": model, "optimizer": optimizer, "step": steps})
        fresh, fresh_optimizer = setup(fabric, seed=123, depth=depth)
        restored = {"model": fresh, "optimizer": fresh_optimizer, "step": 0}
        remainder = fabric.load(folder, restored)
        batch = Tokens().data[:GLOBAL_BATCH]
        result["reloaded"] = {
            "remainder": sorted(remainder),
            "step": restored["step"],
            "state": full_state(fresh),
            "optimizer_steps": sorted({int(s["step"]) for s in fresh_optimizer.state.values()}),
            # one more step from the loaded state and from the trained one: the same loss, the same weights
            "next": [float(_one_step(fabric, m, o, batch)) for m, o in ((fresh, fresh_optimizer), (model, optimizer))],
            "next_equal": all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)),
        }
    if misuse:
        result["misuse"] = pipeline_misuse(fabric, model, optimizer)
    return result


def mlp_pipeline_train(fabric: Any, options: dict[str, Any], steps: int = STEPS) -> dict[str, Any]:
    """:class:`ResidualMLP` split by :func:`split_mlp` and trained through ``fabric.pipeline_step``; then a
    ``split_fn`` that returns one module too many."""
    torch.manual_seed(0)
    with fabric.init_module(empty_init=True):
        model = ResidualMLP()
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=LR, foreach=False))
    inputs, targets = points(steps)
    losses = []
    for step in range(steps):
        window = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        optimizer.zero_grad()
        losses.append(fabric.pipeline_step(model, inputs[window], target=targets[window], loss_fn=F.mse_loss).item())
        optimizer.step()
    wrong = ResidualMLP()
    wrong.wrong_split = True
    return {"losses": losses, "state": full_state(model), "wrong_split": error_of(lambda: fabric.setup_module(wrong))}


def _one_step(fabric: Any, model: Any, optimizer: Any, batch: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = fabric.pipeline_step(model, batch[:, :-1], target=batch, loss_fn=loss_of)
    optimizer.step()
    return loss


def pipeline_misuse(fabric: Any, model: Any, optimizer: Any) -> dict[str, Any]:
    """What a pipelined model refuses, and its evaluation step under ``torch.no_grad()``."""
    batch = Tokens().data[:GLOBAL_BATCH]

    def evaluate() -> dict[str, Any]:
        optimizer.zero_grad()
        before = local_digests(model.module)
        with torch.no_grad():
            loss = fabric.pipeline_step(model, batch[:, :-1], target=batch, loss_fn=loss_of)
        grads = [p.grad for p in model.parameters()]
        return {
            "loss": loss.item(),
            "unchanged": local_digests(model.module) == before,
            "grads": grads == [None] * len(grads),
        }

    def backward_after_step() -> dict[str, Any]:
        loss = _one_step(fabric, model, optimizer, batch)
        return error_of(lambda: fabric.backward(loss))

    return record(
        {
            "evaluate": evaluate,
            "backward": backward_after_step,
            "direct_call": lambda: error_of(lambda: model(batch[:, :-1])),
            "no_backward_sync": lambda: error_of(lambda: fabric.no_backward_sync(model).__enter__()),
            "indivisible": lambda: error_of(
                lambda: fabric.pipeline_step(model, batch[:6, :-1], target=batch[:6], loss_fn=loss_of)
            ),
            "compiled": lambda: error_of(lambda: fabric.setup_module(torch.compile(Llama()))),
        }
    )


def train_then_misuse(fabric: Any, options: dict[str, Any], folder: str) -> dict[str, Any]:
    return {"train": train(fabric, options, folder=folder), "misuse": misuse(fabric, options, folder)}


def main() -> None:
    from tests.helpers.jobs._runner import serve

    serve(make_fabric, lambda fabric, options: globals()[options["job"]](fabric, options, **options.get("kwargs", {})))


if __name__ == "__main__":
    main()
