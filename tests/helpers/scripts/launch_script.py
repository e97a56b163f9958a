"""A script for the launcher tests: every rank runs a few collectives and prints one RESULT line.

python tests/helpers/scripts/launch_script.py --strategy ddp --devices 2 [--fail-rank 1 --fail-mode raise]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy

#: the --strategy names run with a DDPStrategy of this start method (ddp_forkserver has no registered name)
STARTS = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_forkserver": "forkserver"}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", default="2")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fail-rank", type=int, default=-1, help="-2: every rank")
    parser.add_argument(
        "--fail-mode", default="raise", choices=["raise", "sigkill", "segv", "busy", "sleep", "exit0", "mismatch"]
    )
    parser.add_argument("--trap-sigterm", action="store_true", help="ranks started by a launcher note SIGTERM")
    parser.add_argument("--fail-step", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="collective timeout, set once the group formed")
    parser.add_argument(
        "--rendezvous-timeout",
        type=float,
        default=120.0,
        help="how long the group may take to form: covers the slowest start of a loaded machine",
    )
    parser.add_argument(
        "--start-after",
        help="a folder: write started-<LOCAL_RANK> there, then wait for a file `go` before launching (so that a short"
        " rendezvous timeout counts from when every rank is up, not from the first rank's start)",
    )
    return parser.parse_args()


def wait_for_go(folder: str, bound_s: float = 300.0) -> None:
    """Say this rank has started, then wait for the test's ``go`` (never longer than ``bound_s``: a test that died
    before writing it leaves no rank waiting)."""
    with open(os.path.join(folder, f"started-{os.environ.get('LOCAL_RANK', '0')}"), "w"):
        pass
    deadline = time.monotonic() + bound_s
    while not os.path.exists(os.path.join(folder, "go")):
        if time.monotonic() > deadline:
            sys.exit(f"launch_script: no `go` file in {folder} within {bound_s:.0f} s")
        time.sleep(0.02)


def emit(line: str) -> None:
    # one write() per line: lines from several processes sharing a pipe never interleave
    os.write(1, (line + "\n").encode())


def fail(mode: str, rank: int, fabric: Fabric) -> None:
    emit(f"FAILING rank={rank} at={time.time()}")  # the tests time the job's end from here
    if mode == "raise":
        raise ValueError(f"boom on rank {rank}")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segv":
        ctypes.string_at(0)
    if mode in ("busy", "sleep"):
        time.sleep(600)
    if mode == "mismatch":  # a different collective from the other ranks' all_reduce
        fabric.barrier()
    if mode == "exit0":
        emit(f"EXITING EARLY rank={rank}")
        os._exit(0)


def trap_sigterm(rank: int) -> None:
    def noted(signum: int, frame: object) -> None:
        emit(f"GOT SIGTERM rank={rank}")
        os._exit(3)

    signal.signal(signal.SIGTERM, noted)


def work(fabric: Fabric, args: argparse.Namespace) -> dict:
    if args.strategy in STARTS and args.rendezvous_timeout != args.timeout:
        # the group formed within the generous rendezvous timeout; collectives now fail after --timeout
        fabric.strategy.set_collective_timeout(timedelta(seconds=args.timeout))
    if args.trap_sigterm and (fabric.global_rank != 0 or STARTS.get(args.strategy) not in (None, "popen")):
        trap_sigterm(fabric.global_rank)
    emit(f"READY rank={fabric.global_rank} pid={os.getpid()}")
    fabric.print(f"PRINTED by rank {fabric.global_rank}")
    total = 0.0
    for step in range(args.steps):
        if args.fail_rank in (fabric.global_rank, -2) and step == args.fail_step:
            fail(args.fail_mode, fabric.global_rank, fabric)
            if args.fail_mode == "mismatch":
                continue
        total += fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum").item()
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank])).flatten().tolist()
    result = {
        "rank": fabric.global_rank,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "world": fabric.world_size,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "total": total,
        "gathered": gathered,
        "env_local_rank": os.environ.get("LOCAL_RANK"),
        "strategy": type(fabric.strategy).__name__,
        "device": str(fabric.device),
    }
    emit("RESULT " + json.dumps(result))
    return result


def main() -> None:
    args = parse()
    devices: int | str = int(args.devices) if args.devices.isdigit() else args.devices
    if args.strategy in STARTS:
        start = STARTS[args.strategy]
        strategy: object = DDPStrategy(start_method=start, timeout=timedelta(seconds=args.rendezvous_timeout))
    else:
        strategy = args.strategy
    fabric = Fabric(accelerator="cpu", devices=devices, num_nodes=args.num_nodes, strategy=strategy)
    if args.start_after:
        wait_for_go(args.start_after)
    if STARTS.get(args.strategy) not in (None, "popen"):
        result = fabric.launch(work, args)
        emit("LAUNCHER " + json.dumps(result))
    else:
        fabric.launch()
        work(fabric, args)


if __name__ == "__main__":
    main()
    sys.exit(0)
