"""Pipeline parallelism for ``ModelParallelStrategy`` over ``torch.distributed.pipelining``: the schedules by name,
which stages a rank runs, the rank's stages as one module for the optimizer and checkpoints, and one training step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module

from fabric_lite.strategies.parallelize import Dropped

#: the training schedules of torch.distributed.pipelining (``Schedule<name>``) and how many stages each rank runs
#: under them: 1, 2 in a V (rank r runs stages r and 2 * size - 1 - r), or None for as many as asked (default 2)
SCHEDULES: dict[str, int | None] = {
    "GPipe": 1,
    "1F1B": 1,
    "Interleaved1F1B": None,
    "LoopedBFS": None,
    "InterleavedZeroBubble": None,
    "ZBVZeroBubble": 2,
    "DualPipeV": 2,
}
_V_SHAPED = ("ZBVZeroBubble", "DualPipeV")


def schedule_name(name: str) -> str:
    """``name`` as :data:`SCHEDULES` spells it (any case is accepted); ``ValueError`` naming the choices."""
    known = {choice.lower(): choice for choice in SCHEDULES}
    if not isinstance(name, str) or name.lower() not in known:
        raise ValueError(
            f"ModelParallelStrategy(pipeline_schedule={name!r}): not a training schedule of"
            f" torch.distributed.pipelining; choose one of {', '.join(SCHEDULES)}."
        )
    return known[name.lower()]


def schedule_class(name: str) -> type[Any]:
    """torch's class for schedule ``name``; ``ValueError`` where this torch does not have it."""
    from torch.distributed.pipelining import schedules

    found = getattr(schedules, f"Schedule{schedule_name(name)}", None)
    if found is None:
        raise ValueError(
            f"ModelParallelStrategy(pipeline_schedule={name!r}): torch {torch.__version__} has no Schedule{name}."
            " Choose another schedule, or upgrade torch."
        )
    return found  # type: ignore[no-any-return]


def stages_per_rank(name: str, asked: int | None) -> int:
    """How many stages each rank runs under schedule ``name``: its fixed number, else ``asked`` (default 2).
    ``ValueError`` where ``asked`` does not fit the schedule."""
    fixed = SCHEDULES[schedule_name(name)]
    if asked is not None and (type(asked) is not int or asked < 1 or (fixed is not None and asked != fixed)):
        choice = f"{fixed} (or leave it None)" if fixed is not None else "a positive int"
        raise ValueError(
            f"ModelParallelStrategy(pipeline_schedule={name!r}, pipeline_stages_per_rank={asked!r}): this schedule"
            f" runs {'a fixed number of' if fixed else 'several'} stages per rank; pass {choice}."
        )
    return fixed if fixed is not None else asked or 2


def stage_indices(name: str, rank: int, size: int, per_rank: int) -> list[int]:
    """The stages that pipeline rank ``rank`` of ``size`` runs: a loop (``rank``, ``rank + size``, ...), or a V."""
    if schedule_name(name) in _V_SHAPED:
        return [rank, 2 * size - 1 - rank]
    return [rank + round_ * size for round_ in range(per_rank)]


def merge_stages(parts: list[Module]) -> Module:
    """The rank's stages as one module with the whole model's names, for ``model.parameters()`` and checkpoints: the
    part itself for one stage, else a :class:`RankStages` holding the union of their children, a
    :class:`~fabric_lite.strategies.parallelize.Dropped` part giving way to a real one.

    Raises:
        ValueError: two stages hold different modules with parameters of their own under one name.
    """
    merged = parts[0]
    for part in parts[1:]:
        merged = _merge(merged, part, "")
    return merged


class RankStages(Module):
    """The stages one pipeline rank runs, as one module whose state dict has the whole model's names. It holds their
    parameters; the pipeline's schedule runs the stages, so calling it is an error."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_DIRECT_CALL.format(name="model"))


_DIRECT_CALL = (
    "This {name} is one pipeline rank's part of the model: calling it would run only this rank's layers. Run a"
    " training or evaluation step with fabric.pipeline_step(model, inputs, target=..., loss_fn=...) instead of"
    " model(inputs)."
)


def _merge(a: Module, b: Module, path: str) -> Module:
    if a is b or isinstance(b, Dropped):
        return a
    if isinstance(a, Dropped):
        return b
    clash = [n for n in a._parameters.keys() & b._parameters.keys() if a._parameters[n] is not b._parameters[n]]
    if clash:
        raise ValueError(
            f"The pipeline stages of one rank hold different parameters {path + '.' if path else ''}{clash[0]}"
            f" ({type(a).__name__}, {type(b).__name__}). A split_fn must give each stage the model's own modules"
            " under the model's names, with parallelize.Dropped where another stage runs the part."
        )
    union = RankStages()
    union._parameters.update({**b._parameters, **a._parameters})
    union._buffers.update({**b._buffers, **a._buffers})
    union._non_persistent_buffers_set.update(a._non_persistent_buffers_set | b._non_persistent_buffers_set)
    union._modules.update(a._modules)
    for name, child in b._modules.items():
        mine = union._modules.get(name)
        union._modules[name] = (
            child if mine is None or child is None else _merge(mine, child, f"{path}.{name}".lstrip("."))
        )
    return union


def _own_output(module: Module, args: Any, output: Any) -> Any:
    """A stage's output that is a view (a tensor-parallel layer's local shard, passed on by a ``Dropped`` part) as a
    tensor of its own: it is sent to the next stage, and FSDP2 warns that a view may lose its backward hook."""
    return output.clone() if isinstance(output, Tensor) and output._is_view() else output


class Pipeline:
    """A rank's stages and their schedule: :meth:`step` runs forward and backward over the micro-batches.

    Args:
        parts: the rank's stage modules, parallelised and on ``device``, in the order of ``stages``.
        stages, num_stages: their stage indices and the number of stages in all.
        group: the pipeline dimension's process group.
        schedule: a name from :data:`SCHEDULES`; ``microbatches``: how many each batch is split into.
    """

    def __init__(
        self,
        parts: list[Module],
        stages: list[int],
        num_stages: int,
        group: Any,
        device: torch.device,
        schedule: str,
        microbatches: int,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle

        self.parts, self.microbatches, self.device = parts, microbatches, device
        self.module = merge_stages(parts)
        self._group, self._active = group, False
        self._loss_fn: Callable[..., Tensor] | None = None
        self.last_loss: Tensor | None = None  # what step() returned last, which fabric.backward refuses
        self._foreign: set[str] | None = None
        self._first, self._last = 0 in stages, num_stages - 1 in stages
        size = dist.get_world_size(group)
        holder = next(r for r in range(size) if num_stages - 1 in stage_indices(schedule, r, size, len(stages)))
        self._last_rank = dist.get_global_rank(group, holder)
        torch_stages = [
            PipelineStage(p, i, num_stages, device, group=group) for p, i in zip(parts, stages, strict=True)
        ]
        cls = schedule_class(schedule)
        single = self._single = issubclass(cls, PipelineScheduleSingle)
        self._schedule_name = schedule
        try:
            self.schedule = cls(torch_stages[0] if single else torch_stages, microbatches, loss_fn=self._loss)
        except ValueError as err:
            raise ValueError(
                f"ModelParallelStrategy(pipeline_schedule={schedule!r}, pipeline_microbatches={microbatches}): {err}"
            ) from err
        for part in parts:  # before FSDP2's own hooks, which would gather the parameters first
            part.register_forward_pre_hook(self._refuse_direct_call, prepend=True)
            part.register_forward_hook(_own_output, prepend=True)

    def foreign_keys(self) -> set[str]:
        """The state-dict keys of the other pipeline ranks' stages (exchanged at the first call, which every rank of
        the pipeline must make)."""
        if self._foreign is None:
            own = set(self.module.state_dict())
            everyone: list[set[str] | None] = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(everyone, own, group=self._group)
            self._foreign = set().union(*(keys for keys in everyone if keys is not None)) - own
        return self._foreign

    def complete_groups(self, optimizer_state: dict[str, Any]) -> dict[str, Any]:
        """``optimizer_state`` (keyed by parameter name) with parameter groups that list the parameters of every
        stage, in stage order, so that the checkpoint's one copy of them fits any pipeline size. Every rank of the
        pipeline must call it."""
        groups = optimizer_state.get("param_groups", [])
        everyone: list[list[list[str]] | None] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(everyone, [list(group["params"]) for group in groups], group=self._group)
        merged = [
            {**group, "params": list(dict.fromkeys(n for rank in everyone if rank for n in rank[index]))}
            for index, group in enumerate(groups)
        ]
        return {**optimizer_state, "param_groups": merged}

    def _loss(self, output: Any, target: Any) -> Tensor:
        assert self._loss_fn is not None  # set by step() before the schedule runs
        return self._loss_fn(output, target)

    def _refuse_direct_call(self, module: Module, args: Any) -> None:
        if not self._active:
            raise RuntimeError(_DIRECT_CALL.format(name=type(module).__name__))

    @contextmanager
    def _running(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def step(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any, loss_fn: Callable[..., Tensor]
    ) -> Tensor:
        """Run the schedule over ``args``/``kwargs``/``target`` split into micro-batches along their first dimension:
        forward and backward where gradients are enabled, forward only under ``torch.no_grad()`` (single-stage
        schedules). Returns the mean of the micro-batches' losses, the same on every rank of the pipeline. Every rank
        of the pipeline must call it with the same batch; the ranks' values of ``args`` other than the first stage's
        are not used.

        Raises:
            ValueError: a tensor whose first dimension the micro-batches do not divide, or no input.
            RuntimeError: forward only under a multi-stage schedule.
        """
        self._check_batch(args, kwargs, target)
        if not torch.is_grad_enabled() and not self._single:
            # torch's eval() runs a multi-stage schedule's backward actions too, fails, and leaves the stages broken
            raise RuntimeError(
                f"fabric.pipeline_step under torch.no_grad() with pipeline_schedule={self._schedule_name!r}: the"
                f" multi-stage schedules of torch {torch.__version__} cannot run the forward alone. Evaluate with a"
                " single-stage schedule ('GPipe' or '1F1B'), or load a checkpoint into a model without a pipeline."
            )
        self._loss_fn = loss_fn
        losses: list[Tensor] = []
        # contiguous: a stage checks its inputs' strides against the first step's (a sliced batch[:, :-1] is not)
        inputs = tuple(a.contiguous() if isinstance(a, Tensor) else a for a in args) if self._first else ()
        labels = target if self._last else None
        with self._running():
            if torch.is_grad_enabled():
                self.schedule.step(*inputs, target=labels, losses=losses, return_outputs=False, **kwargs)
            else:
                self.schedule.eval(*inputs, target=labels, losses=losses, **kwargs)
        if self._last:
            loss = torch.stack([item.detach().float() for item in losses]).mean()
        else:
            loss = torch.empty((), dtype=torch.float32, device=self.device)
        dist.broadcast(loss, src=self._last_rank, group=self._group)
        self.last_loss = loss
        return loss

    def _check_batch(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> None:
        if not args:
            raise ValueError(
                "fabric.pipeline_step(model): no inputs; pass the batch the first stage takes, e.g."
                " fabric.pipeline_step(model, tokens, target=labels, loss_fn=loss_fn)."
            )
        named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [(f"{k}=", v) for k, v in kwargs.items()]
        for name, value in [*named, ("target", target)]:
            if isinstance(value, Tensor) and value.dim() and value.shape[0] % self.microbatches:
                raise ValueError(
                    f"fabric.pipeline_step: the batch of {name} has {value.shape[0]} samples, which"
                    f" pipeline_microbatches={self.microbatches} does not divide. Use a batch size that is a multiple"
                    f" of {self.microbatches} (e.g. DataLoader(..., drop_last=True)), or another number of"
                    " micro-batches."
                )
