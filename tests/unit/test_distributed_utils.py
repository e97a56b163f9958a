"""``fabric_lite.utilities.distributed`` and ``Fabric.gather_for_metrics`` in this process.

Without a process group every utility is an identity or a no-op, and ``gather_for_metrics`` returns its data.
``init_dist_connection`` creates a one-rank gloo group and then reuses it, needs ``MASTER_PORT`` for several
processes, and registers an NCCL group, not a gloo one, to be destroyed at exit.

The checks that start processes are in tests/distributed/test_distributed_utils.py.
"""

from __future__ import annotations

import os
from typing import Any
from unittest.mock import Mock

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from fabric_lite import Fabric
from fabric_lite.plugins.environments import LightningEnvironment
from fabric_lite.utilities import distributed
from fabric_lite.utilities.distributed import (
    AllGatherGrad,
    _InfiniteBarrier,
    _is_dtensor,
    all_gather_ddp_if_available,
    distributed_available,
    gather_all_tensors,
    init_dist_connection,
    register_ddp_comm_hook,
    sync_ddp_if_available,
)


# ---------------------------------------------------------------------------------------------- no process group
def test_without_process_group_every_utility_is_an_identity() -> None:
    assert not distributed_available()
    x = torch.arange(3.0, requires_grad=True)
    assert all_gather_ddp_if_available(x) is x
    assert all_gather_ddp_if_available(x, sync_grads=True) is x
    assert gather_all_tensors(x) == [x]
    assert sync_ddp_if_available(x, reduce_op="mean") is x
    assert sync_ddp_if_available(5) == 5
    with pytest.raises(ValueError, match="median"):
        sync_ddp_if_available(x, reduce_op="median")  # a wrong op fails on one process too
    assert register_ddp_comm_hook(nn.Linear(2, 2), ddp_comm_hook=default_hooks.fp16_compress_hook) is None
    with pytest.raises(ValueError, match="no ddp_comm_hook"):
        register_ddp_comm_hook(nn.Linear(2, 2), ddp_comm_state=object())
    with pytest.raises(TypeError, match="expects a tensor"):
        gather_all_tensors([1, 2])  # type: ignore[arg-type]


def test_gather_for_metrics_on_one_process_returns_the_data() -> None:
    fabric = Fabric(accelerator="cpu", devices=1)
    data = {"preds": torch.arange(4), "name": "x"}
    assert fabric.gather_for_metrics(data) is data


def test_without_process_group_the_infinite_barrier_does_nothing() -> None:
    with _InfiniteBarrier() as barrier:
        barrier()
    assert barrier.group is None


def test_is_dtensor() -> None:
    from torch.distributed.tensor import DTensor

    assert _is_dtensor(Mock(spec=DTensor)) and not _is_dtensor(torch.zeros(2)) and not _is_dtensor([1])


def test_an_nccl_group_is_destroyed_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch warns at exit about an NCCL group that was never destroyed; gloo groups are left to torch."""
    registered: list[Any] = []
    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: None)
    environment = LightningEnvironment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    init_dist_connection(environment, "nccl", global_rank=0, world_size=1)
    assert registered == [distributed._destroy_dist_connection]
    init_dist_connection(environment, "gloo", global_rank=0, world_size=1)
    assert registered == [distributed._destroy_dist_connection]


def test_all_gather_grad_requires_a_process_group() -> None:
    with pytest.raises((RuntimeError, ValueError)):
        AllGatherGrad.apply(torch.ones(2))


def test_init_dist_connection_creates_then_reuses_the_default_group() -> None:
    environment = LightningEnvironment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
    try:
        init_dist_connection(environment, "gloo", global_rank=0, world_size=1)
        assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "0"
        init_dist_connection(environment, "gloo", global_rank=0, world_size=1)  # the same settings: nothing to do
        with pytest.raises(RuntimeError, match=r"world_size=2.*world size 1"):
            init_dist_connection(environment, "gloo", global_rank=0, world_size=2)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_init_dist_connection_needs_a_port_for_several_processes() -> None:
    with pytest.raises(ValueError, match="MASTER_PORT"):
        init_dist_connection(LightningEnvironment({}), "gloo", global_rank=0, world_size=2)
    assert not dist.is_initialized()
