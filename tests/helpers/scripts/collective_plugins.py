"""Every call of ``TorchCollective`` on N real gloo processes; run with COLLECTIVE_IMPL=fabric_lite or lightning.

    COLLECTIVE_IMPL=fabric_lite python tests/helpers/scripts/collective_plugins.py 3 out.json

The parent picks a free port, spawns N ranks with torch.multiprocessing, and each rank runs the same cases in the
same order, recording ``{case: observation}``; the parent writes ``[rank0, rank1, ...]`` as JSON. A case that raises
is recorded as ``["raised", type, message]``. Inputs depend on the rank, so tests/distributed/test_collective_plugins.py
computes every expected value exactly. Only this script's first import differs between the two implementations.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if os.environ.get("COLLECTIVE_IMPL") == "lightning":
    from lightning_fabric.plugins.collectives import TorchCollective
else:
    from fabric_lite.plugins.collectives import TorchCollective


def describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), value.tolist()]
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def groups() -> int:
    return len(dist.distributed_c10d._pg_map) if dist.is_initialized() else 0


def subgroup_ranks(world: int) -> list[int]:
    """The ranks of the group that leaves rank 1 out: [0, 2] of 3, [1] of 2 (then rank 0 is the outsider)."""
    return [0, 2] if world == 3 else [1]


def run(rank: int, world: int, port: int) -> dict[str, Any]:
    obs: dict[str, Any] = {}

    def case(name: str, fn: Any) -> Any:
        if os.environ.get("COLLECTIVE_DEBUG"):
            print(rank, name, flush=True)
        try:
            value = fn()
            obs[name] = describe(value)
            return value
        except Exception as err:
            obs[name] = ["raised", type(err).__name__, str(err).splitlines()[0] if str(err) else ""]
            return None

    c = TorchCollective()
    obs["initialized_before"] = TorchCollective.is_initialized()
    obs["is_available"] = TorchCollective.is_available()
    case("group_before_setup", lambda: c.create_group())  # no default group yet: raises
    c._group = None
    c.setup(
        main_address="127.0.0.1",
        main_port=port,
        backend="gloo",
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=60),
    )
    obs["initialized_after_setup"] = TorchCollective.is_initialized()
    obs["manages_default_group"] = TorchCollective.manages_default_group
    obs["env_left_after_setup"] = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ]
    c.create_group()
    obs["groups_after_create"] = groups()
    obs["rank"], obs["world_size"] = c.rank, c.world_size
    case("create_group_twice", lambda: c.create_group())

    case("broadcast", lambda: c.broadcast(torch.tensor([rank + 1.0, 10.0 * rank]), src=world - 1))
    for op in ("sum", "max", "min", "product", "avg", "SUM", dist.ReduceOp.MAX, "mean", "prod", "nope", 3):
        name = op if isinstance(op, str) else repr(op)
        case(f"all_reduce/{name}", lambda op=op: c.all_reduce(torch.tensor([rank + 1.0, 2.0 * rank + 3.0]), op=op))
    case("all_reduce/default", lambda: c.all_reduce(torch.tensor([rank + 1])))
    case("all_reduce/int_avg", lambda: c.all_reduce(torch.tensor([rank + 2]), op="avg"))
    reduced = c.reduce(torch.tensor([rank + 1.0]), dst=0, op="sum")  # only rank 0's result is specified
    obs["reduce"] = reduced.item() if rank == 0 else None
    case("all_gather", lambda: c.all_gather([torch.zeros(2) for _ in range(world)], torch.arange(2.0) + 2 * rank))
    case(
        "gather",
        lambda: c.gather(torch.tensor([rank * 3.0]), [torch.zeros(1) for _ in range(world)] if rank == 0 else [], 0),
    )
    case(
        "scatter",
        lambda: c.scatter(
            torch.zeros(1), [torch.tensor([10.0 * i + 1]) for i in range(world)] if rank == 0 else [], src=0
        ),
    )
    case(
        "reduce_scatter",
        lambda: c.reduce_scatter(torch.zeros(1), [torch.tensor([100.0 * i + rank]) for i in range(world)], op="sum"),
    )
    case(
        "all_to_all",
        lambda: c.all_to_all(
            [torch.zeros(1) for _ in range(world)], [torch.tensor([10.0 * rank + j]) for j in range(world)]
        ),
    )

    def point_to_point() -> list[Any]:
        got = []
        for other in range(1, world):  # rank 0 sends to every other rank, each answers with tag=its rank
            if rank == 0:
                c.send(torch.tensor([100.0 + other]), dst=other)
                src = None if other == world - 1 else other  # the last answer is received from any rank
                got.append(c.recv(torch.zeros(1), src=src, tag=other).item())
            elif rank == other:
                got.append(c.recv(torch.zeros(1), src=0).item())
                c.send(torch.tensor([7.0 * rank]), dst=0, tag=rank)
        return got

    case("send_recv", point_to_point)
    case("barrier", lambda: c.barrier())
    case("monitored_barrier", lambda: c.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True))
    case("all_gather_object", lambda: c.all_gather_object([None] * world, {"r": rank}))
    case("broadcast_object_list", lambda: c.broadcast_object_list([f"from {rank}", rank], src=world - 1))
    case("gather_object", lambda: c.gather_object(("g", rank), [None] * world if rank == 0 else [], dst=0))
    case(
        "scatter_object_list",
        lambda: c.scatter_object_list([None], [f"part {i}" for i in range(world)] if rank == 0 else [], src=0),
    )

    # a group that leaves one rank out: every rank creates it, members compute, the outsider gets no-ops
    members = subgroup_ranks(world)
    sub = TorchCollective().create_group(ranks=members)
    obs["sub/groups_after_create"] = groups()
    obs["sub/rank"], obs["sub/world_size"] = sub.rank, sub.world_size
    case("sub/all_reduce", lambda: sub.all_reduce(torch.tensor([rank + 1.0]), op="sum"))
    case("sub/broadcast", lambda: sub.broadcast(torch.tensor([rank * 5.0]), src=members[-1]))
    case("sub/all_gather", lambda: sub.all_gather([torch.zeros(1) for _ in members], torch.tensor([rank + 0.5])))
    case("sub/barrier", lambda: sub.barrier())
    sub.teardown()
    obs["sub/groups_after_teardown"] = groups()
    case("sub/group_after_teardown", lambda: sub._group)
    c.barrier()

    # the classmethods, on their own
    g = TorchCollective.new_group(ranks=list(range(world)))
    obs["new_group/groups"] = groups()
    obs["new_group/sum"] = describe([t := torch.tensor([rank + 1.0]), dist.all_reduce(t, group=g), t][2])
    TorchCollective.destroy_group(g)
    obs["destroy_group/groups"] = groups()
    TorchCollective.destroy_group(g)  # twice: nothing happens
    obs["destroy_group_twice/groups"] = groups()

    c.teardown()
    obs["teardown/initialized"] = TorchCollective.is_initialized()
    obs["teardown/manages_default_group"] = TorchCollective.manages_default_group
    obs["teardown/groups"] = groups()
    case("teardown_twice", lambda: c.teardown())
    return obs


def worker(rank: int, world: int, port: int, out: str) -> None:
    try:
        result = run(rank, world, port)
    except Exception:
        result = {"traceback": traceback.format_exc()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def main() -> None:
    world, out = int(sys.argv[1]), sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(worker, args=(world, port, out), nprocs=world, start_method="spawn")
    results = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
        os.remove(f"{out}.{rank}")
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
