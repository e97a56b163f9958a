"""Checkpoints on fsspec URLs in new processes: fsspec missing, two ranks on ``file://``, FSDP on ``memory://``.

* In a fresh interpreter: without fsspec, local paths still work and a URL gives the install hint; local and
  ``file://`` saves and loads never import fsspec.
* Two ranks on a ``file://`` URL: save and load agree across ranks, and a failed save raises on both, naming the path.
* A sharded (DCP) FSDP checkpoint on a ``memory://`` URL, on one rank: save, replace, a failed save that keeps the
  previous checkpoint, load. The real S3 server tier is tests/tiers/s3/test_s3.py.

The checks that start no process are in tests/unit/test_remote.py.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.harness import base_env, spawn_job


@pytest.mark.timeout(180)
def test_without_fsspec_urls_give_the_install_hint(tmp_path: Path) -> None:
    code = f"""
import sys
sys.modules["fsspec"] = None  # as if fsspec were not installed
import torch
from fabric_lite import Fabric
fabric = Fabric(accelerator="cpu", devices=1)
fabric.save({str(tmp_path / "local.ckpt")!r}, {{"step": 1}})  # local paths need no fsspec
assert fabric.load({str(tmp_path / "local.ckpt")!r})["step"] == 1
try:
    fabric.save("memory://x/y.ckpt", {{"step": 1}})
except ImportError as err:
    print("ERROR", err)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR 'memory://x/y.ckpt' needs the fsspec package" in done.stdout
    assert "pip install fsspec" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.ckpt"]


@pytest.mark.timeout(180)
def test_local_save_and_import_do_not_import_fsspec(tmp_path: Path) -> None:
    code = f"""
import sys
from fabric_lite import Fabric
fabric = Fabric(accelerator="cpu", devices=1)
fabric.save({str(tmp_path / "a.ckpt")!r}, {{"step": 1}})
fabric.load({str(tmp_path / "a.ckpt")!r})
fabric.save("file://{tmp_path}/b.ckpt", {{"step": 1}})
fabric.load("file://{tmp_path}/b.ckpt")
print(sorted(m for m in sys.modules if m.startswith("fsspec")))
"""
    done = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.distributed
def test_two_ranks_file_url(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    results = spawn_job("tests.helpers.jobs.remote_jobs:save_load", 2, url=url)
    for rank, seen in enumerate(results):
        assert seen["loaded"] == seen["saved"], rank
        assert seen["step"] == 3 and seen["raw"]
    assert results[0]["saved"] == results[1]["saved"]  # DDP kept the ranks in step
    failed = spawn_job("tests.helpers.jobs.remote_jobs:failed_save", 2, url=url)
    for rank, seen in enumerate(failed):
        assert seen["error"] is not None and f"{tmp_path}/kept.ckpt" in seen["error"], (rank, seen)
        assert seen["after"] == 1, rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.ckpt", "raw-0.pt", "raw-1.pt", "state.ckpt"]


def _check_sharded_on_url(results: list[dict[str, Any]], url: str) -> None:
    """What tests.helpers.jobs.fsdp_jobs.sharded_on_url saw on every rank, against what a sharded save must do."""
    world = len(results)
    shards = [f"__{rank}_0.distcp" for rank in range(world)]
    expected_files = sorted([".metadata", "fabric_lite.json", "meta.pt", *shards])
    for rank, seen in enumerate(results):
        failed = {name: value for name, value in seen.items() if isinstance(value, dict) and "traceback" in value}
        assert not failed, (rank, failed)
        assert seen["save"] == {"first": expected_files, "replaced": expected_files}, rank  # no temp folder left
        assert seen["failed_save"]["type"] == "CheckpointError", rank  # on every rank
        assert f"{url}/ckpt" in seen["failed_save"]["message"], rank
        assert "refuses to be pickled" in seen["failed_save"]["message"], rank
        after = seen["after_failure"]
        assert after["files"] == expected_files, rank  # the previous checkpoint, and no leftovers
        assert (after["counter"], after["step"], after["remainder"]) == (3, 3, []), rank
        for key, value in seen["expected"]["model"].items():
            assert torch.equal(after["model"][key], value), (rank, key)
        expected_state = seen["expected"]["optimizer"]["state"]
        for name, buffers in expected_state.items():
            assert torch.equal(after["optimizer"]["state"][name]["momentum_buffer"], buffers["momentum_buffer"])
        assert seen["whole"] == ["counter", "model", "optimizer", "step"], rank
        assert seen["not_a_checkpoint"]["type"] == "FileNotFoundError", rank
        assert f"{url}/nothing-here" in seen["not_a_checkpoint"]["message"], rank


@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_fsdp_sharded_checkpoint_on_a_memory_url() -> None:
    """A sharded (DCP) folder written and read through fsspec: save, replace, a failed save that keeps the previous
    checkpoint, load, on a ``memory://`` URL (one rank: the memory filesystem lives in one process; two ranks on a
    real S3 server are in tests/tiers/s3/test_s3.py)."""
    from tests.distributed.test_fsdp import fsdp_job

    url = f"memory://fsdp-{uuid.uuid4().hex}"
    _check_sharded_on_url(fsdp_job("sharded_on_url", 1, strategy="fsdp", kwargs={"url": url}), url)
