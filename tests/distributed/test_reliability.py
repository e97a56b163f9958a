"""The reliability cases that have no other home (RELIABILITY.md 10, 25, 26, 27, 29).

The whole tier, every case of RELIABILITY.md wherever its tests live, runs with
``pytest -m reliability --reliability-report``: the report is a table of case, result and time to fail (see
``tests/reliability_cases.py``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from fabric_lite._plan import ENV_DEBUG, resolve_debug
from tests.helpers.harness import FULL_EXIT, REPO, _kill_session, _session_members, base_env, run_python, spawn_job
from tests.helpers.jobs.collectives import catch

pytestmark = pytest.mark.distributed

LAUNCH = "tests/helpers/scripts/launch_script.py"


# ---------------------------------------------------------------------------------------------- case 10
@pytest.mark.parametrize(("debug", "bound"), [("1", 10.0), ("0", 5.0 + 10.0)])
def test_mismatched_collectives_fail_on_every_rank_naming_them(debug, bound, record_property):
    """Rank 1 calls ``barrier`` where rank 0 calls ``all_reduce``. In debug mode (``FABRIC_LITE_DEBUG=1``) both
    raise at once with a per-rank table; without it, the job still fails within the 5 s timeout, naming the
    collective and pointing to the debug mode. Never a hang, never wrong data."""
    args = [LAUNCH, "--fail-rank", "1", "--fail-mode", "mismatch", "--fail-step", "1", "--timeout", "5"]
    done = run_python(args, timeout=90, env=base_env({ENV_DEBUG: debug}))
    assert done.returncode != 0, done.output
    assert "RESULT" not in done.stdout, "a rank finished as if nothing had happened"
    time_to_fail = done.seconds_after("FAILING rank=1 ")
    record_property("time_to_fail_s", round(time_to_fail, 2))
    assert time_to_fail < bound, done.output
    if debug == "1":
        assert "Root cause: rank 0 failed: CollectiveMismatchError: The ranks called different collectives" in (
            done.stderr
        )
        assert "rank 0: all_reduce(reduce_op=sum) on [('float32', ())]" in done.stderr
        assert "rank 1: barrier on []" in done.stderr
    else:
        assert "timed out after 0:00:05" in done.stderr and "FABRIC_LITE_DEBUG=1" in done.stderr, done.output


def test_debug_argument_and_environment_variable():
    assert resolve_debug(None, {}) is False
    assert resolve_debug(None, {ENV_DEBUG: "1"}) is True
    assert resolve_debug(None, {ENV_DEBUG: " TRUE "}) is True
    assert resolve_debug(None, {ENV_DEBUG: "0"}) is False
    assert resolve_debug(False, {ENV_DEBUG: "1"}) is False  # the argument wins
    assert resolve_debug(True, {}) is True
    with pytest.raises(ValueError, match=r"FABRIC_LITE_DEBUG='maybe' is not understood: set it to 1"):
        resolve_debug(None, {ENV_DEBUG: "maybe"})
    with pytest.raises(TypeError, match=r"Fabric\(debug='yes'\) must be True, False or None"):
        resolve_debug("yes", {})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- case 25
def test_uneven_data_is_equalised_or_refused():
    results = spawn_job("tests.distributed.test_reliability:uneven_batches", 2, timeout=90)
    # 5 samples, 2 ranks, batches of 2: the DistributedSampler pads to 3 samples per rank, 2 batches each
    assert [r["distributed_sampler_batches"] for r in results] == [2, 2]
    for rank, r in enumerate(results):
        refused = r["own_sampler_uneven"]
        assert refused.type == "ValueError", refused
        assert "different numbers of batches" in refused.message
        assert "rank 0: [2] batches" in refused.message and "rank 1: [3] batches" in refused.message
        assert "use_distributed_sampler=True" in refused.message, f"rank {rank}: no fix in {refused.message}"
        assert r["own_sampler_even"] == 3


# ---------------------------------------------------------------------------------------------- case 26
@pytest.mark.timeout(300)
def test_soak_thousands_of_collectives_values_checked_memory_flat(record_property):
    counts = {"all_reduce": 10_000, "all_gather": 5_000, "broadcast": 2_000, "barrier": 5_000}
    results = spawn_job("tests.distributed.test_reliability:soak", 2, timeout=280, **counts)
    for rank, r in enumerate(results):
        assert r["calls"] == sum(counts.values())
        assert r["wrong"] == {"all_reduce": 0, "all_gather": 0, "broadcast": 0}, f"rank {rank}: wrong values"
        samples = r["rss"]
        assert len(samples) >= 30
        # after a warm-up (allocator pools, gloo buffers), resident memory stays flat
        early, late = statistics.median(samples[5:10]), statistics.median(samples[-5:])
        record_property(f"rank{rank}_rss_growth_mb", round(late - early, 2))
        assert late - early < 8.0, f"rank {rank}: resident memory grew from {early:.1f} MB to {late:.1f} MB"
    record_property("seconds", round(max(r["seconds"] for r in results), 1))


# ---------------------------------------------------------------------------------------------- case 27
@pytest.mark.timeout(260)
def test_twenty_launch_train_teardown_cycles_in_one_process():
    done = run_python(["tests/helpers/scripts/cycles.py", "20"], timeout=240)
    assert done.returncode == 0, done.output
    cycles = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [c["cycle"] for c in cycles] == list(range(20))
    first = cycles[0]
    for c in cycles:
        assert c["children"] == 0, c
        assert c["threads"] == first["threads"], (
            f"threads leaked: {first['thread_names']} -> {c['thread_names']} (cycle {c['cycle']})"
        )
        assert c["fds"] == first["fds"], f"file descriptors (sockets, pipes) leaked: {first['fds']} -> {c['fds']}"


@pytest.mark.timeout(240)
def test_four_two_rank_jobs_started_at_once_without_a_port():
    env = base_env()
    env.pop("MASTER_PORT", None)
    tmp = tempfile.mkdtemp(prefix="fabric_lite_test_tmp_")
    env["TMPDIR"] = tmp
    jobs = [
        subprocess.Popen(
            [sys.executable, LAUNCH, "--strategy", strategy, "--steps", "5"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for strategy in ("ddp", "ddp", "ddp_spawn", "ddp_spawn")
    ]
    try:
        outputs = [job.communicate(timeout=200) for job in jobs]
        for job, (out, err) in zip(jobs, outputs):
            assert job.returncode == 0, out + err
            assert "terminate called" not in err, err
            results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
            assert sorted(r["rank"] for r in results) == [0, 1], out + err
            assert all(r["total"] == 15.0 for r in results), results
        deadline = time.monotonic() + 5  # exiting helpers (spawn's resource tracker) get a moment, as in run_python
        while any(_session_members(job.pid) for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for job in jobs:
            assert _session_members(job.pid) == [], "a process of a finished job is still alive"
        assert os.listdir(tmp) == [], f"temporary files left behind: {os.listdir(tmp)}"
    finally:
        for job in jobs:
            _kill_session(job.pid)
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        for name in os.listdir(tmp):
            Path(tmp, name).unlink()
        os.rmdir(tmp)


# ---------------------------------------------------------------------------------------------- case 29
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_jobs_that_end_normally_exit_0_on_every_rank_every_time(strategy):
    """Four runs in a row: exit code 0, every rank's result, and no gloo abort at interpreter exit (its whole
    shutdown, as outside the suite)."""
    for attempt in range(4):
        done = run_python([LAUNCH, "--strategy", strategy, "--steps", "3"], timeout=90, env=base_env(FULL_EXIT))
        assert done.returncode == 0, f"run {attempt}: {done.output}"
        assert done.stdout.count("RESULT ") == 2, done.output
        assert "terminate called" not in done.stderr and "Aborted" not in done.stderr, done.output


def test_sigkill_of_a_rank_is_reported_within_seconds(record_property):
    """Time to fail for the report: rank 1 kills itself with SIGKILL at step 2; the job ends non-zero."""
    start = time.monotonic()
    done = run_python([LAUNCH, "--fail-rank", "1", "--fail-mode", "sigkill", "--timeout", "30"], timeout=90)
    record_property("time_to_fail_s", round(time.monotonic() - start, 2))
    assert done.returncode != 0
    assert f"was killed by {signal.Signals.SIGKILL.name}" in done.stderr, done.output


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def uneven_batches(fabric: Any) -> dict[str, Any]:
    """Case 25: 5 samples on 2 ranks through a DistributedSampler give both ranks the same number of batches and
    the epoch ends without a hang; loaders whose own sampler gives the ranks different numbers of batches are
    refused at setup on every rank."""
    rank, world = fabric.global_rank, fabric.world_size
    out: dict[str, Any] = {}
    module = nn.Linear(3, 1)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(5, 1))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=2))
    batches = 0
    for x, y in loader:
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        batches += 1
    fabric.barrier()  # every rank reaches the end of the epoch
    out["distributed_sampler_batches"] = batches

    class OwnShard(Sampler[int]):
        """A user's sampler that splits unevenly: rank r gets r + 2 samples."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __iter__(self) -> Any:
            return iter(range(self.n))

        def __len__(self) -> int:
            return self.n

    uneven = DataLoader(data, batch_size=1, sampler=OwnShard(rank + 2))
    out["own_sampler_uneven"] = catch(lambda: fabric.setup_dataloaders(uneven, use_distributed_sampler=False))
    even = DataLoader(data, batch_size=1, sampler=OwnShard(3))
    out["own_sampler_even"] = catch(lambda: len(fabric.setup_dataloaders(even, use_distributed_sampler=False)))
    out["world"] = world
    return out


def soak(fabric: Any, all_reduce: int, all_gather: int, broadcast: int, barrier: int) -> dict[str, Any]:
    """Case 26: thousands of collectives of each kind, every value checked, memory sampled along the way."""
    rank, world = fabric.global_rank, fabric.world_size
    wrong: dict[str, int] = {"all_reduce": 0, "all_gather": 0, "broadcast": 0}
    rss: list[float] = []
    started = time.perf_counter()
    total = all_reduce + all_gather + broadcast + barrier
    sample_every = max(1, total // 40)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if done % sample_every == 0:
            rss.append(_rss_mb())

    for i in range(all_reduce):
        # a collection with two dtypes, rank- and step-dependent, reduced with a rotating op
        op = ("sum", "max", "min", "mean")[i % 4]
        data = {"f": torch.tensor([float(rank + i), float(-rank)]), "i": torch.tensor(rank * 10 + i % 7)}
        got = fabric.all_reduce(data, reduce_op=op)
        ranks = range(world)
        expected_f = {
            "sum": [sum(r + i for r in ranks), -sum(ranks)],
            "max": [world - 1 + i, 0],
            "min": [i, -(world - 1)],
            "mean": [sum(r + i for r in ranks) / world, -sum(ranks) / world],
        }[op]
        ints = [r * 10 + i % 7 for r in ranks]
        expected_i = {"sum": sum(ints), "max": max(ints), "min": min(ints), "mean": int(sum(ints) / world)}[op]
        if got["f"].tolist() != expected_f or got["i"].item() != expected_i:
            wrong["all_reduce"] += 1
        tick()
    for i in range(all_gather):
        size = 1 + i % 300  # small payloads travel with the shape check, larger ones after it
        got = fabric.all_gather(torch.full((size,), rank + i, dtype=torch.int64))
        if got.shape != (world, size) or got[:, 0].tolist() != [r + i for r in range(world)]:
            wrong["all_gather"] += 1
        tick()
    for i in range(broadcast):
        src = i % world
        payload = torch.arange(i % 50, dtype=torch.float32) + src if i % 2 else {"step": i, "from": src}
        got = fabric.broadcast(payload if rank == src else None, src=src)
        expected = torch.arange(i % 50, dtype=torch.float32) + src if i % 2 else {"step": i, "from": src}
        same = torch.equal(got, expected) if isinstance(expected, torch.Tensor) else got == expected
        if not same:
            wrong["broadcast"] += 1
        tick()
    for _ in range(barrier):
        fabric.barrier()
        tick()
    return {"wrong": wrong, "rss": rss, "seconds": time.perf_counter() - started, "calls": done}
