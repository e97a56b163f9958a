"""Checkpoints across processes: a killed writer, a really full disk, and two ranks (RELIABILITY.md 15, 16 and 20).

* A writer killed with SIGKILL mid-write leaves the previous checkpoint intact; the next save removes the dead
  writer's temporary file and leaves alone those of a live writer or of another host.
* A save onto a tmpfs too small for it fails naming the path and keeps the previous file (skipped where ``unshare``
  or mounting a tmpfs is not allowed).
* Two ranks (the job ``observe``, at the end of this module): one writer, no rank returns before the file is
  complete, identical state after loading, and a failed save raises on both ranks.

The checks that start no process are in tests/unit/test_checkpoints.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite.runtime.checkpoint import CheckpointError
from tests.helpers.harness import per_rank
from tests.unit.test_checkpoints import Unpicklable, _only, _previous_checkpoint

_KILLED_WRITER = """
import sys, torch
from fabric_lite.runtime.checkpoint import atomic_save
state = {"weights": torch.ones(96 * 2**20), "step": 2}  # 384 MiB: the write takes long enough to be caught
print("WRITING", flush=True)
atomic_save(state, sys.argv[1])
print("DONE", flush=True)
"""


@pytest.mark.timeout(120)
def test_sigkill_mid_write_leaves_the_previous_checkpoint(tmp_path):
    """RELIABILITY 15: the writer is killed with SIGKILL while the file is being written; the previous
    checkpoint is intact and loadable, and the next save removes the dead writer's temporary file."""
    fabric, fmodel, path, before = _previous_checkpoint(tmp_path)
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "WRITING"
        deadline = time.monotonic() + 60
        temps: list[Path] = []
        while time.monotonic() < deadline:
            temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            if temps and temps[0].stat().st_size > 8 * 2**20:
                break
            assert writer.poll() is None, "the writer finished before it could be killed"
            time.sleep(0.005)
        assert temps, "the writer never started writing"
        os.killpg(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
    assert path.read_bytes() == before
    assert fabric.load(path)["step"] == 1
    (leftover,) = temps
    assert leftover.exists() and leftover.stat().st_size < 96 * 2**22, "expected a partial temporary file"
    assert f".{os.getpid()}." not in leftover.name and f".{writer.pid}." in leftover.name
    # the next save (any process) removes what the dead writer left, and writes the new checkpoint
    fabric.save(path, {"model": fmodel, "step": 3})
    assert fabric.load(path)["step"] == 3
    assert _only(tmp_path) == [path.name], "the dead writer's temporary file was not removed"


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    """Only files of processes that no longer exist are removed: a concurrent writer's file is not touched."""
    fabric, fmodel, path, _ = _previous_checkpoint(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        host = socket.gethostname().replace(".", "-")
        live = tmp_path / f".{path.name}.{host}.{sleeper.pid}.abc123.tmp"
        other_host = tmp_path / f".{path.name}.another-host.1.abc123.tmp"
        live.write_bytes(b"partial")
        other_host.write_bytes(b"partial")
        fabric.save(path, {"model": fmodel, "step": 2})
        assert live.exists() and other_host.exists()
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
    fabric.save(path, {"model": fmodel, "step": 3})
    assert not live.exists() and other_host.exists()


_TINY_FS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch
    from fabric_lite.runtime.checkpoint import CheckpointError, atomic_save
    folder = sys.argv[1]
    path = os.path.join(folder, "ckpt.pt")
    atomic_save({"step": 1}, path)
    before = open(path, "rb").read()
    try:
        atomic_save({"step": 2, "big": torch.zeros(1_000_000)}, path)
        error = None
    except CheckpointError as err:
        error = str(err)
    print(json.dumps({"error": error, "intact": open(path, "rb").read() == before,
                      "files": sorted(os.listdir(folder)), "step": torch.load(path)["step"]}))
    """
)


@pytest.mark.timeout(60)
def test_really_full_filesystem(tmp_path):
    """A real 256 KiB tmpfs in a private mount namespace (skipped where unshare/mount are not allowed)."""
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace: {probe.stderr.decode().strip()}")
    from tests.helpers.harness import REPO, base_env

    folder = tmp_path / "tiny"
    folder.mkdir()
    script = tmp_path / "fill_the_disk.py"
    script.write_text(_TINY_FS_SCRIPT)
    command = f'mount -t tmpfs -o size=256k tmpfs "{folder}" || exit 77; exec "{sys.executable}" "{script}" "{folder}"'

    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=50,
        env=base_env(),
        cwd=REPO,
    )
    if done.returncode == 77:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] is not None and str(folder / "ckpt.pt") in result["error"]
    assert result["intact"] and result["files"] == ["ckpt.pt"] and result["step"] == 1


# ---------------------------------------------------------------------------------------------- two ranks
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from tests.helpers.harness import spawn_job

    folder = tmp_path_factory.mktemp("two_ranks")
    return spawn_job("tests.distributed.test_checkpoints:observe", 2, timeout=90, folder=str(folder))


def _both(two_ranks, check):
    return per_rank(two_ranks, check)


@pytest.mark.distributed
def test_two_ranks_exactly_one_writer(two_ranks):
    r0, r1 = _both(two_ranks, "save_then_load")
    assert r0["writers"] == [0] and r1["writers"] == []


@pytest.mark.distributed
def test_two_ranks_return_only_after_the_file_is_complete(two_ranks):

    for r in _both(two_ranks, "save_then_load"):
        assert r["exists_on_return"] and r["file_matches"]
        assert r["save_seconds"] >= WRITE_DELAY  # rank 1 waited for rank 0's slow write
        assert r["file_keys"] == ["model", "optimizer", "step"]
        assert r["model_keys"] == r["expected_model_keys"]  # no "module." prefix from DDP
        assert r["leftovers"] == []


@pytest.mark.distributed
def test_two_ranks_hold_identical_state_after_loading(two_ranks):
    for r in _both(two_ranks, "save_then_load"):
        assert r["loaded_equals_saved"] and r["ranks_identical"]
        assert r["exp_avg_restored"] and r["exp_avg_identical"]
        assert r["step"] == 3 and r["remainder"] == []


@pytest.mark.distributed
@pytest.mark.parametrize("check", ["failed_save", "unwritable_path"])
def test_two_ranks_a_failed_save_raises_on_both(two_ranks, check):
    for r in _both(two_ranks, check):
        assert r["error"] == "CheckpointError", r
        assert r["path"] in r["message"]
        assert r["after"] == 2.0  # both ranks are still in step after the failure
        if check == "failed_save":
            assert r["previous_intact"] and r["leftovers"] == []


WRITE_DELAY = 0.5  # seconds rank 0 spends before writing: a rank that returned early would find no file


def _flat_parameters(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def _model_and_optimizer(fabric: Any) -> tuple[Any, Any, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fmodel, foptimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.05))
    # one step on rank-dependent data, so that the optimizer has state
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) + fabric.global_rank
    fabric.backward(fmodel(x).pow(2).sum())
    foptimizer.step()
    foptimizer.zero_grad()
    return fmodel, foptimizer, model


def check_save_then_load(fabric: Any, folder: str) -> dict[str, Any]:
    rank = fabric.global_rank
    path = Path(folder) / "two_ranks.ckpt"
    fmodel, foptimizer, model = _model_and_optimizer(fabric)
    saved_parameters = _flat_parameters(model).clone()

    writers: list[int] = []
    real_save = torch.save

    def recording_save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        writers.append(rank)
        time.sleep(WRITE_DELAY)
        return real_save(obj, f, *args, **kwargs)

    torch.save = recording_save
    try:
        started = time.monotonic()
        fabric.save(path, {"model": fmodel, "optimizer": foptimizer, "step": 3})
        save_seconds = time.monotonic() - started
    finally:
        torch.save = real_save
    # checked before any other collective: the file must be complete the moment save returns, on every rank
    exists_on_return = path.is_file()
    content = torch.load(path, weights_only=True) if exists_on_return else {}
    file_matches = exists_on_return and torch.equal(
        torch.cat([v.reshape(-1) for v in content["model"].values()]), saved_parameters
    )
    leftovers = sorted(name for name in os.listdir(folder) if name != path.name)

    # make every rank's parameters and optimizer state different, then load
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank + 1.0)
    for state in foptimizer.optimizer.state.values():
        state["exp_avg"].fill_(rank + 5.0)
    loaded_state = {"model": fmodel, "optimizer": foptimizer, "step": 0}
    remainder = fabric.load(path, loaded_state)
    parameters = _flat_parameters(model)
    exp_avg = torch.cat([s["exp_avg"].reshape(-1) for s in foptimizer.optimizer.state.values()])
    gathered_parameters = fabric.all_gather(parameters)
    gathered_exp_avg = fabric.all_gather(exp_avg)
    return {
        "writers": writers,
        "save_seconds": save_seconds,
        "exists_on_return": exists_on_return,
        "file_matches": bool(file_matches),
        "file_keys": sorted(content),
        "model_keys": sorted(content.get("model", {})),
        "expected_model_keys": sorted(model.state_dict()),
        "leftovers": leftovers,
        "loaded_equals_saved": torch.equal(parameters, saved_parameters),
        "ranks_identical": torch.equal(gathered_parameters[0], gathered_parameters[1]),
        "exp_avg_identical": torch.equal(gathered_exp_avg[0], gathered_exp_avg[1]),
        "exp_avg_restored": not bool((exp_avg == rank + 5.0).all()),
        "step": loaded_state["step"],
        "remainder": sorted(remainder),
    }


def _save_error(fabric: Any, path: Path, state: dict[str, Any]) -> dict[str, Any]:
    try:
        fabric.save(path, state)
    except CheckpointError as err:
        outcome = {"error": "CheckpointError", "message": str(err)}
    except Exception as err:
        outcome = {"error": type(err).__name__, "message": str(err)}
    else:
        outcome = {"error": None, "message": ""}
    # both ranks must still be in step: a collective after the failure must not hang
    outcome["after"] = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()
    return outcome


def check_failed_save(fabric: Any, folder: str) -> dict[str, Any]:
    fmodel, _, _ = _model_and_optimizer(fabric)
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    before = path.read_bytes()
    outcome = _save_error(fabric, path, {"model": fmodel, "bad": Unpicklable()})
    outcome["previous_intact"] = path.read_bytes() == before
    outcome["path"] = str(path)
    outcome["leftovers"] = sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))
    return outcome


def check_unwritable_path(fabric: Any, folder: str) -> dict[str, Any]:
    fmodel, _, _ = _model_and_optimizer(fabric)
    blocker = Path(folder) / "a_file.txt"
    if fabric.global_rank == 0:
        blocker.write_text("not a folder")
    fabric.barrier()
    path = blocker / "ckpt.pt"
    outcome = _save_error(fabric, path, {"model": fmodel})
    outcome["path"] = str(path)
    return outcome


CHECKS = {
    "save_then_load": check_save_then_load,
    "failed_save": check_failed_save,
    "unwritable_path": check_unwritable_path,
}


def observe(fabric: Any, folder: str) -> dict[str, Any]:
    results: dict[str, Any] = {"rank": fabric.global_rank}
    for name, check in CHECKS.items():
        subfolder = Path(folder) / name
        if fabric.global_rank == 0:
            subfolder.mkdir(parents=True, exist_ok=True)
        fabric.barrier()
        try:
            results[name] = check(fabric, str(subfolder))
        except Exception:
            results[name] = {"traceback": traceback.format_exc()}
    return results
