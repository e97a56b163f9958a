"""Synchronised batch norm for ``DDPStrategy(sync_batchnorm=True)``, also on the CPU (:class:`CPUSyncBatchNorm`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from fabric_lite.runtime.collectives.gather import _AllGatherGrad


class CPUSyncBatchNorm(_BatchNorm):
    """``torch.nn.SyncBatchNorm`` for CPU tensors (gloo): in training, the output, running statistics and gradients
    equal a single ``BatchNorm``'s over the batches of every process of ``process_group`` (one collective per call);
    in eval mode, or without a process group, a plain ``BatchNorm``, whose checkpoints it shares. Every process must
    run the forward (and backward) of every call in training mode.

    Example::

        model = DDPStrategy(sync_batchnorm=True)  # on the CPU, BatchNorm layers become CPUSyncBatchNorm at setup
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(input)
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if dist.get_world_size(group) == 1:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, True, momentum, self.eps
            )
        return self._sync_batch_norm(input, momentum, group)

    def _sync_batch_norm(self, input: Tensor, momentum: float, group: Any) -> Tensor:
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        count = input.numel() // max(channels, 1)
        if count > 0:
            mean = input.mean(dims)
            m2 = (input - mean.view(shape)).square().sum(dims)
        else:  # an empty batch still takes part in the collective, with a count of 0
            mean = input.sum(dims)
            m2 = input.sum(dims)
        local = torch.cat([mean.new_full((1,), float(count)), mean, m2])
        # differentiable: a rank's statistics receive the gradients of every rank's loss
        gathered: Tensor = _AllGatherGrad.apply(local, group)  # type: ignore[no-untyped-call]
        counts, means, m2s = gathered[:, :1], gathered[:, 1 : channels + 1], gathered[:, channels + 1 :]
        total = counts.sum()
        total_count = int(total.item())
        if total_count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {total_count} over every process"
                f" (input of shape {tuple(input.shape)} here)."
            )
        global_mean = (counts * means).sum(0) / total
        # parallel variance: each rank's squared deviations plus its count times the shift of its mean
        global_var = (m2s + counts * (means - global_mean).square()).sum(0) / total
        running_mean, running_var = self.running_mean, self.running_var
        if self.track_running_stats and running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
                unbiased = global_var * (total_count / (total_count - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        out = (input - global_mean.view(shape)) * torch.rsqrt(global_var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape)
        if self.bias is not None:
            out = out + self.bias.view(shape)
        return out


def convert_sync_batchnorm(module: nn.Module, device_type: str, process_group: Any | None = None) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by a synchronised one sharing its parameters and buffers
    (:class:`CPUSyncBatchNorm` on the CPU); return the module, or a new layer when it is itself one."""
    if device_type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)  # type: ignore[no-untyped-call,no-any-return]
    return _convert_cpu(module, process_group)


def _convert_cpu(module: nn.Module, process_group: Any | None) -> nn.Module:
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, CPUSyncBatchNorm):
        converted = CPUSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
        )
        # the same Parameter and buffer objects: optimizers created before the conversion keep working
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(converted, name, getattr(module, name))
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, _convert_cpu(child, process_group))
    return converted
