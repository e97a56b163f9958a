"""Checkpoints and logs on a real S3 server: moto's, started on 127.0.0.1 for this module.

s3fs and moto are installed into .venv-s3/site on first use (tests/helpers/cluster/s3_setup.py, ~40 s once); every
fabric_lite job runs in a child process with that folder on PYTHONPATH and the server as its S3 endpoint.

    .venv/bin/python -m pytest -q -m s3     # the tier alone (the whole suite skips it unless FABRIC_LITE_S3=1)
    FABRIC_LITE_S3=1 ...   # S3 that cannot be set up is an error, not a skip
    FABRIC_LITE_S3=0 ...   # skip without trying
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.cluster.s3_setup import S3Server, S3Unavailable, ensure_installed, s3_env
from tests.helpers.harness import Completed, base_env, optional_tier_skipped, run_job, run_python

pytestmark = [pytest.mark.s3, pytest.mark.distributed]

JOB_TIMEOUT = 120


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest) -> Iterator[str]:
    """The endpoint of a running moto S3 server holding an empty bucket ``fabric``; stopped after the module."""
    reason = optional_tier_skipped(request.config, "s3", "FABRIC_LITE_S3", "test_s3.py")
    if reason:
        pytest.skip(reason)
    wanted = os.environ.get("FABRIC_LITE_S3", "")
    try:
        ensure_installed(timeout=180)
        server = S3Server().start()
    except S3Unavailable as error:
        message = (
            f"S3 tier: no s3fs/moto: {error}. It needs pip access to them; FABRIC_LITE_S3=1 turns this skip into"
            " an error."
        )
        if wanted == "1":
            pytest.fail(message)
        pytest.skip(message)
    try:
        urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/fabric", method="PUT"), timeout=10).close()
        yield server.endpoint
    finally:
        server.stop()


def _env(endpoint: str) -> dict[str, str]:
    return s3_env(base_env(), endpoint)


def _job(endpoint: str, target: str, nprocs: int, **kwargs: Any) -> list[Any]:
    """``target(fabric, **kwargs)`` on ``nprocs`` ranks (ddp_fork, gloo) with the S3 endpoint configured."""
    arguments = ["-m", "tests.helpers.jobs._runner", target, str(nprocs), json.dumps(kwargs)]
    return run_job(arguments, JOB_TIMEOUT, env=_env(endpoint))  # type: ignore[no-any-return]


def _python(endpoint: str, code: str, env: dict[str, str] | None = None) -> Completed:
    done = run_python(["-c", code], timeout=JOB_TIMEOUT, env=env or _env(endpoint))
    assert done.returncode == 0, done.output
    return done


def _url() -> str:
    return f"s3://fabric/{uuid.uuid4().hex}"


@pytest.mark.parametrize("nprocs", [1, 2])
def test_save_load_load_raw(s3: str, nprocs: int) -> None:
    results = _job(s3, "tests.helpers.jobs.remote_jobs:save_load", nprocs, url=_url())
    for rank, seen in enumerate(results):
        assert seen["loaded"] == seen["saved"] and seen["step"] == 3 and seen["remainder"] == {}, rank
        assert seen["whole_keys"] == ["model", "optimizer", "step"] and seen["raw"], rank
    assert all(seen["saved"] == results[0]["saved"] for seen in results)


def test_failed_save_keeps_previous_object_on_every_rank(s3: str) -> None:
    url = _url()
    for rank, seen in enumerate(_job(s3, "tests.helpers.jobs.remote_jobs:failed_save", 2, url=url)):
        assert seen["error"] is not None and f"{url}/kept.ckpt" in seen["error"], (rank, seen)
        assert seen["after"] == 1, rank


def test_failed_upload_keeps_previous_object_and_storage_options(s3: str) -> None:
    """The endpoint only through storage_options; then an upload that fails (the endpoint refuses connections)
    leaves the object the real endpoint holds as it was."""
    url = f"{_url()}/x.ckpt"
    env = _env(s3)
    for name in ("AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL"):
        env.pop(name)
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    code = f"""
import torch
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError
from fabric_lite.utilities.cloud_io import get_filesystem
io = TorchCheckpointIO()
io.save_checkpoint({{"step": 1}}, {url!r}, storage_options={{"endpoint_url": {s3!r}}})
try:
    io.save_checkpoint({{"step": 2}}, {url!r}, storage_options={{"endpoint_url": {dead!r},
                       "config_kwargs": {{"retries": {{"max_attempts": 1}}}}, "retries": 1}})
except CheckpointError as err:
    print("ERROR", err)
fs = get_filesystem({url!r}, endpoint_url={s3!r})
print("AFTER", torch.load(fs.open({url!r}, "rb"), weights_only=True)["step"])
"""
    done = _python(s3, code, env)
    assert f"ERROR Saving the checkpoint to '{url}' failed" in done.stdout, done.output
    assert "AFTER 1" in done.stdout, done.output


def test_upload_failing_after_its_first_part_keeps_previous_object(s3: str) -> None:
    """A multipart upload that fails once the server holds its first part (the connection drops before the second):
    the object at the URL stays byte for byte what it was, and nothing partial appears beside it."""
    folder = _url()
    url = f"{folder}/big.ckpt"
    code = f"""
import boto3, s3fs, torch
from fabric_lite.runtime.checkpoint import CheckpointError, atomic_save
from fabric_lite.utilities.cloud_io import get_filesystem

# s3fs uploads in parts from 100 MiB (2 x its 50 MiB part): here parts of 5 MiB, S3's smallest, one at a time,
# so that a 12 MiB checkpoint goes up in three parts
PART = 5 * 2**20
pipe_file, call_s3 = s3fs.S3FileSystem._pipe_file, s3fs.S3FileSystem._call_s3
seen = {{"fail": False, "sent": [], "held": None}}

async def pipe_in_parts(self, path, data, **kwargs):
    kwargs.update(chunksize=PART, max_concurrency=1)
    return await pipe_file(self, path, data, **kwargs)

async def call(self, method, *args, **kwargs):
    if method == "upload_part":
        if seen["fail"] and kwargs["PartNumber"] == 2:
            ids = {{name: kwargs[name] for name in ("Bucket", "Key", "UploadId")}}
            listed = boto3.client("s3").list_parts(**ids)  # what the server holds of this upload now
            seen["held"] = [part["PartNumber"] for part in listed.get("Parts", [])]
            raise ConnectionResetError("connection reset by peer while sending part 2")
        seen["sent"].append(kwargs["PartNumber"])
    return await call_s3(self, method, *args, **kwargs)

s3fs.S3FileSystem._pipe_file = pipe_in_parts  # before the filesystem object exists: it binds them when created
s3fs.S3FileSystem._call_s3 = call
atomic_save({{"step": 1, "w": torch.full((3 * 2**20,), 1.0)}}, "{url}")  # 12 MiB
print("FIRST", seen["sent"])
fs = get_filesystem("{url}")
before = fs.cat_file("{url}")
seen["fail"], seen["sent"] = True, []
try:
    atomic_save({{"step": 2, "w": torch.full((3 * 2**20,), 2.0)}}, "{url}")
except CheckpointError as err:
    print("ERROR", err)
print("SENT", seen["sent"], "HELD", seen["held"])
fs.invalidate_cache()
print("SAME", fs.cat_file("{url}") == before)
print("LISTED", [name.rsplit("/", 1)[-1] for name in fs.find("{folder}")])
bucket, key = "{url}"[len("s3://") :].split("/", 1)
print("UPLOADS", len(boto3.client("s3").list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])))
"""
    out = _python(s3, code).stdout
    assert "FIRST [1, 2, 3]" in out, out  # the first checkpoint went up in three parts too
    assert f"ERROR Saving the checkpoint to '{url}' failed: ConnectionResetError" in out, out
    assert "SENT [1] HELD [1]" in out, out  # the server had received part 1 when the transfer broke
    assert "SAME True" in out and "LISTED ['big.ckpt']" in out, out
    assert "UPLOADS 0" in out, out  # the unfinished upload was aborted: its part is not kept (nor billed)


def test_csv_and_tensorboard_loggers_on_s3(s3: str, tmp_path: Path) -> None:
    """Both loggers write to S3 on two ranks (rank 0 alone); every rank lists the objects and reads them back."""
    from tests.distributed.test_loggers import read_events

    url = _url()
    results = _job(s3, "tests.helpers.jobs.remote_jobs:loggers", 2, url=url)
    for rank, seen in enumerate(results):
        assert seen["log_dirs"] == [f"{url}/exp/version_0", f"{url}/tb/version_0"], rank
        assert seen["csv"].splitlines() == ["loss,step", "0.0,0", "1.0,1", "2.0,2"], rank  # rank 0's values
        assert seen["next_versions"] == [1, 1], rank  # found by listing the bucket
        # tensorboard (through boto3) also leaves an empty `version_0/` folder marker; tensorboardX nothing else
        assert sorted(name for name, size in seen["objects"].items() if size) == [
            "exp/version_0/metrics.csv",
            *seen["events"],
        ], (rank, seen["objects"])
        assert len(seen["events"]) == 1 and next(iter(seen["events"])).startswith("tb/version_0/events.out.tfevents")
    events = tmp_path / "events"
    events.mkdir()
    for name, data in results[0]["events"].items():
        (events / name.rsplit("/", 1)[-1]).write_bytes(data)
    scalars, _ = read_events(events)
    assert scalars == {"loss": [(0, 0.0), (1, 1.0), (2, 2.0)], "hp_metric": [(0, -1.0)]}, results[0]["backend"]


def test_upload_time_of_10_mb(s3: str) -> None:
    code = f"""
import time, torch
from fabric_lite.runtime.checkpoint import atomic_save, safe_load
state = {{"w": torch.randn(2_621_440)}}  # 10 MiB of float32
url = "{_url()}/big.ckpt"
atomic_save(state, url)  # the first request sets up the client
start = time.perf_counter(); atomic_save(state, url); up = time.perf_counter() - start
start = time.perf_counter(); back = safe_load(url); down = time.perf_counter() - start
assert torch.equal(back["w"], state["w"])
print(f"TIMES upload {{up:.3f}} s, download {{down:.3f}} s")
"""
    done = _python(s3, code)
    print(done.stdout.strip())
    assert "TIMES upload" in done.stdout


def test_consolidate_from_s3(s3: str) -> None:
    url = _url()
    code = f"""
import torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from fabric_lite.runtime.checkpoint import safe_load
from fabric_lite.utilities.consolidate import main
dcp.save({{"model": {{"w": torch.arange(6.0)}}, "step": 4}}, storage_writer=FsspecWriter("{url}/sharded"), no_dist=True)
assert main(["{url}/sharded", "--output_file", "{url}/full.ckpt"]) == 0
loaded = safe_load("{url}/full.ckpt")
print("LOADED", loaded["step"], loaded["model"]["w"].tolist())
"""
    assert "LOADED 4 [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in _python(s3, code).stdout


def _fsdp_job(endpoint: str, nprocs: int, **kwargs: Any) -> list[dict[str, Any]]:
    """``tests.helpers.jobs.fsdp_jobs.sharded_on_url`` on ``nprocs`` ranks (strategy="fsdp") against the S3 server."""
    options = {"strategy": "fsdp", "kwargs": kwargs}
    arguments = ["-m", "tests.helpers.jobs.fsdp_jobs", "sharded_on_url", str(nprocs), json.dumps(options)]
    return run_job(arguments, JOB_TIMEOUT, env=_env(endpoint))  # type: ignore[no-any-return]


def test_fsdp_sharded_checkpoint_on_two_ranks_then_one(s3: str) -> None:
    """Every rank writes its shards to S3 through DCP's FsspecWriter; the folder replaces the previous one with its
    .metadata last; a failed save keeps the previous one; the checkpoint loads on one rank and consolidates."""
    from tests.distributed.test_remote import _check_sharded_on_url

    url = _url()
    two = _fsdp_job(s3, 2, url=url)
    _check_sharded_on_url(two, url)
    one = _fsdp_job(s3, 1, url=url, load_only=True)[0]
    assert "traceback" not in one["loaded"], one["loaded"]
    for key, value in two[0]["expected"]["model"].items():
        assert torch.equal(one["loaded"]["model"][key], value), key
    consolidated = {"keys": ["counter", "model", "optimizer", "step"], "step": 3, "counter": {"value": 3}}
    assert one["consolidated"] == consolidated
