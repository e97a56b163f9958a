"""Checkpoints and logs on fsspec URLs (``memory://``, ``file://``) in this process, and the refusals: an unknown
protocol, a protocol whose package is missing.

Saving, loading, consolidating and the CSV and TensorBoard loggers on URLs; errors that name the URL; a failed save
that keeps the previous checkpoint, and a failed copy into place that says where the new one is; never a folder named
after a URL. The module needs fsspec (``pip install 'fabric-lite[remote]'``) and skips without it. The real S3
server tier is tests/tiers/s3/test_s3.py.

The checks that start processes are in tests/distributed/test_remote.py.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.loggers import CSVLogger
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError
from fabric_lite.utilities._fs import _is_remote, _local_path
from fabric_lite.utilities.cloud_io import get_filesystem
from tests.helpers.harness import REPO
from tests.helpers.jobs import remote_jobs

fsspec = pytest.importorskip("fsspec", reason="the URL tests need fsspec (pip install 'fabric-lite[remote]')")


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh ``memory://`` folder, removed afterwards (the memory filesystem lives as long as the process)."""
    root = f"memory://test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    path = root[len("memory://") :]
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture
def fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


def test_url_detection_needs_no_fsspec() -> None:
    assert not _is_remote("checkpoints/last.ckpt") and not _is_remote("file:///a/b") and not _is_remote(Path("/x"))
    assert _is_remote("s3://b/k") and _is_remote("memory://x") and _is_remote("simplecache::s3://b/k")
    assert _local_path("file:///a/b.ckpt") == "/a/b.ckpt" and _local_path("a/b") == "a/b"


def test_save_load_load_raw_on_memory(fabric: Fabric, memory_url: str) -> None:
    seen = remote_jobs.save_load(fabric, memory_url)
    assert seen["loaded"] == seen["saved"] and seen["step"] == 3 and seen["remainder"] == {}
    assert seen["whole_keys"] == ["model", "optimizer", "step"] and seen["optimizer_steps"] == [1, 1, 1, 1]
    assert seen["raw"]
    fs = fsspec.filesystem("memory")
    assert fs.isfile(f"{memory_url}/state.ckpt")
    assert not Path("memory:").exists()


def test_save_load_on_file_url(fabric: Fabric, tmp_path: Path) -> None:
    seen = remote_jobs.save_load(fabric, f"file://{tmp_path}/run")
    assert seen["loaded"] == seen["saved"] and seen["step"] == 3 and seen["raw"]
    # a file:// URL is a local path: written with the local atomic save, readable without fsspec
    assert torch.load(tmp_path / "run" / "state.ckpt", weights_only=True)["step"] == 3
    assert not Path("file:").exists()


@pytest.mark.parametrize("kind", ["csv", "tensorboard"])
def test_loggers_on_a_file_url_write_to_its_local_folder(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file:///abs/logs`` is the local folder ``/abs/logs``: never a folder named ``file:`` where the script runs."""
    monkeypatch.chdir(tmp_path)  # a literal `file:` folder would appear here
    if kind == "csv":
        logger: Any = CSVLogger(f"file://{tmp_path}/logs", name="exp", flush_logs_every_n_steps=1)
    else:
        pytest.importorskip("tensorboardX")
        from fabric_lite.loggers import TensorBoardLogger

        logger = TensorBoardLogger(f"file://{tmp_path}/logs", name="exp")
    assert logger.root_dir == str(tmp_path / "logs")
    assert logger.log_dir == str(tmp_path / "logs" / "exp" / "version_0")
    logger.log_metrics({"loss": 0.5}, step=0)
    logger.finalize("success")
    files = os.listdir(logger.log_dir)
    if kind == "csv":
        assert files == ["metrics.csv"]
    else:
        assert any(name.startswith("events.out.tfevents") for name in files), files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]  # and no `file:` folder
    assert type(logger)(f"file://{tmp_path}/logs", name="exp").version == 1  # versions found on the local disk


def test_save_load_and_consolidate_on_file_urls_write_no_url_named_folder(
    fabric: Fabric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed.checkpoint as dcp

    from fabric_lite.utilities.consolidate import main

    monkeypatch.chdir(tmp_path)
    seen = remote_jobs.save_load(fabric, f"file://{tmp_path}/run")
    assert seen["loaded"] == seen["saved"] and seen["raw"]
    dcp.save({"model": {"w": torch.arange(3.0)}, "step": 4}, checkpoint_id=str(tmp_path / "sharded"), no_dist=True)
    assert main([f"file://{tmp_path}/sharded", f"file://{tmp_path}/out/full.ckpt"]) == 0
    assert fabric.load(f"file://{tmp_path}/out/full.ckpt")["step"] == 4
    assert torch.load(tmp_path / "out" / "full.ckpt", weights_only=True)["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run", "sharded"]


def test_missing_empty_and_corrupt_urls_are_named(fabric: Fabric, memory_url: str) -> None:
    missing = f"{memory_url}/nope.ckpt"
    with pytest.raises(FileNotFoundError, match=f"Checkpoint file not found: '{missing}'"):
        fabric.load(missing)
    fs = get_filesystem(memory_url)
    fs.pipe_file(f"{memory_url}/empty.ckpt", b"")
    with pytest.raises(CheckpointError, match=r"empty\.ckpt' is empty"):
        fabric.load(f"{memory_url}/empty.ckpt")
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(100)}, buffer)
    fs.pipe_file(f"{memory_url}/cut.ckpt", buffer.getvalue()[:200])
    with pytest.raises(CheckpointError, match=r"cut\.ckpt' is incomplete or corrupt"):
        fabric.load(f"{memory_url}/cut.ckpt")
    with pytest.raises(CheckpointError, match="it is a folder"):
        fabric.load(memory_url)


def test_weights_only_refusal_names_the_url(fabric: Fabric, memory_url: str) -> None:
    buffer = io.BytesIO()
    torch.save({"layer": nn.Linear(1, 1)}, buffer)
    get_filesystem(memory_url).pipe_file(f"{memory_url}/module.ckpt", buffer.getvalue())
    with pytest.raises(CheckpointError, match=r"Refused to load 'memory://.*module.ckpt' with weights_only=True"):
        fabric.load(f"{memory_url}/module.ckpt")
    assert isinstance(fabric.load(f"{memory_url}/module.ckpt", weights_only=False)["layer"], nn.Linear)


class _BadStateDict:
    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("state_dict failed half-way")

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - never loaded
        pass


@pytest.mark.parametrize("bad", [remote_jobs.Unpicklable(), _BadStateDict()], ids=["unpicklable", "state_dict"])
def test_failed_save_keeps_the_previous_object(fabric: Fabric, memory_url: str, bad: Any) -> None:
    target = f"{memory_url}/last.ckpt"
    fabric.save(target, {"step": 1, "w": torch.ones(1000)})
    before = get_filesystem(target).cat_file(target)
    with pytest.raises(Exception, match="failed") as caught:
        fabric.save(target, {"step": 2, "w": torch.zeros(1000), "bad": bad})
    assert isinstance(caught.value, (CheckpointError, RuntimeError))
    assert get_filesystem(target).cat_file(target) == before
    assert fabric.load(target)["step"] == 1


def test_storage_options_reach_the_filesystem(memory_url: str) -> None:
    seen: list[dict[str, Any]] = []

    class Recording(fsspec.implementations.memory.MemoryFileSystem):  # type: ignore[misc,name-defined]
        protocol = "recording"
        cachable = False

        def __init__(self, **options: Any) -> None:
            seen.append(options)
            super().__init__()

    fsspec.register_implementation("recording", Recording, clobber=True)
    url = f"recording://{memory_url[len('memory://') :]}/x.ckpt"
    TorchCheckpointIO().save_checkpoint({"a": 1}, url, storage_options={"token": "secret"})
    assert {"token": "secret"} in seen
    assert TorchCheckpointIO().load_checkpoint(url) == {"a": 1}
    with pytest.raises(TypeError, match=r"local path .*storage options are for fsspec URLs"):
        TorchCheckpointIO().save_checkpoint({"a": 1}, "x.ckpt", storage_options={"token": "secret"})


def test_remove_checkpoint_on_a_url(memory_url: str) -> None:
    io_ = TorchCheckpointIO()
    io_.save_checkpoint({"a": 1}, f"{memory_url}/x.ckpt")
    io_.remove_checkpoint(f"{memory_url}/x.ckpt")
    assert not get_filesystem(memory_url).exists(f"{memory_url}/x.ckpt")
    io_.remove_checkpoint(f"{memory_url}/x.ckpt")  # nothing there: no error


def test_unknown_protocol_is_refused_and_nothing_written(
    fabric: Fabric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'foo://bucket/x.ckpt' cannot be opened: fsspec knows no filesystem .*'foo'"):
        fabric.save("foo://bucket/x.ckpt", {"step": 1})
    with pytest.raises(ValueError, match=r"'foo://bucket/x\.ckpt'"):
        fabric.load("foo://bucket/x.ckpt")
    with pytest.raises(ValueError, match="'foo://logs'"):
        CSVLogger("foo://logs")
    assert list(tmp_path.iterdir()) == []


def test_protocol_without_its_package_is_refused(
    fabric: Fabric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed here: this test needs a protocol whose package is absent")
    except ImportError:
        pass
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImportError, match=r"'gs://bucket/run/x.ckpt' cannot be opened: .*pip install gcsfs"):
        fabric.save("gs://bucket/run/x.ckpt", {"step": 1})
    with pytest.raises(ImportError, match="pip install gcsfs"):
        fabric.load("gs://bucket/run/x.ckpt")
    with pytest.raises(ImportError, match="pip install gcsfs"):
        CSVLogger("gs://bucket/logs")
    assert list(tmp_path.iterdir()) == []  # above all, no folder named `gs:` with the checkpoint in it


def test_csv_logger_on_memory(memory_url: str) -> None:
    first = CSVLogger(memory_url, name="exp", flush_logs_every_n_steps=2)
    assert first.version == 0 and first.log_dir == f"{memory_url}/exp/version_0"
    for step in range(3):
        first.log_metrics({"loss": float(step)}, step=step)
    first.log_metrics({"acc": 0.5}, step=3)  # a new column: the file is rewritten with the new header
    first.finalize("success")
    text = get_filesystem(memory_url).cat_file(f"{first.log_dir}/metrics.csv").decode()
    assert text.splitlines() == ["acc,loss,step", ",0.0,0", ",1.0,1", ",2.0,2", "0.5,,3"]
    assert CSVLogger(memory_url, name="exp").version == 1  # found by listing the remote folder
    with pytest.warns(UserWarning, match="exists and is not empty"):
        again = CSVLogger(memory_url, name="exp", version=0, flush_logs_every_n_steps=1)
        again.log_metrics({"loss": 9.0}, step=0)
    assert get_filesystem(memory_url).cat_file(f"{first.log_dir}/metrics.csv").decode().splitlines() == [
        "loss,step",
        "9.0,0",
    ]


def test_tensorboard_logger_on_memory(memory_url: str) -> None:
    pytest.importorskip("tensorboardX")
    from fabric_lite.loggers import TensorBoardLogger

    logger = TensorBoardLogger(memory_url, name="tb")
    if logger._backend != "tensorboardX":
        pytest.skip("tensorboard (not tensorboardX) writes URLs itself; this test covers the tensorboardX path")
    logger.log_metrics({"loss": 0.25}, step=1)
    logger.log_hyperparams({"lr": 0.1})
    logger.finalize("success")
    fs = get_filesystem(memory_url)
    files = fs.find(f"{memory_url}/tb/version_0")
    assert len(files) == 1 and "events.out.tfevents" in files[0]
    content = fs.cat_file(files[0])
    assert b"loss" in content and b"hp_metric" in content
    assert TensorBoardLogger(memory_url, name="tb").version == 1
    assert not Path("memory:").exists()


def test_repo_root_untouched() -> None:
    # the refusals above must never create URL-named folders where the suite runs
    assert not any((REPO / name).exists() for name in ("s3:", "gs:", "foo:", "memory:", "file:"))
    assert not any(Path(os.getcwd(), name).exists() for name in ("s3:", "gs:", "foo:", "memory:"))


def test_consolidate_between_urls(memory_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from fabric_lite.utilities.consolidate import main

    state = {"model": {"w": torch.arange(6.0)}, "step": 4}
    dcp.save(state, storage_writer=FsspecWriter(f"{memory_url}/sharded"), no_dist=True)
    dcp.save(state, checkpoint_id=str(tmp_path / "local"), no_dist=True)
    assert main([f"{memory_url}/sharded", "--output_file", f"{memory_url}/one.ckpt"]) == 0
    assert main([str(tmp_path / "local"), f"{memory_url}/two.ckpt"]) == 0
    assert main([f"{memory_url}/sharded", f"file://{tmp_path}/three.ckpt"]) == 0
    for url in (f"{memory_url}/one.ckpt", f"{memory_url}/two.ckpt", f"file://{tmp_path}/three.ckpt"):
        loaded = Fabric(accelerator="cpu", devices=1).load(url)
        assert torch.equal(loaded["model"]["w"], torch.arange(6.0)) and loaded["step"] == 4, url
    capsys.readouterr()
    assert main([f"{memory_url}/sharded", "--output_file", f"{memory_url}/one.ckpt"]) == 1  # never overwritten
    assert "The path for the converted checkpoint already exists" in capsys.readouterr().err
    assert main([f"{memory_url}/nothing", f"{memory_url}/x.ckpt"]) == 1
    assert f"Checkpoint not found: '{memory_url}/nothing'" in capsys.readouterr().err


def test_a_failed_copy_into_place_keeps_the_new_checkpoint_and_says_where(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object stores have no folder rename: the new folder is copied in, ``.metadata`` last. A copy that fails half
    way leaves no folder that passes for a checkpoint, and the error names where the complete new one is."""
    import torch.distributed.checkpoint as dcp

    from fabric_lite.runtime.checkpoint import folders as _dcp

    target = f"{memory_url}/ckpt"
    for step in (1, 2):
        temp = _dcp.make_temp_folder(target)
        assert isinstance(temp, str) and temp.startswith(f"{memory_url}/.ckpt.") and temp.endswith(".tmp")
        dcp.save({"w": torch.full((4,), float(step))}, storage_writer=_dcp.writer(temp), no_dist=True)
        if step == 1:
            _dcp.publish_folder(temp, target)
    fs = fsspec.filesystem("memory")
    copied: list[str] = []
    real_copy = type(fs).copy

    def failing_copy(self: Any, path1: str, path2: str, **kwargs: Any) -> None:
        if copied:
            raise OSError("connection reset while copying")
        copied.append(path1)
        real_copy(self, path1, path2, **kwargs)

    monkeypatch.setattr(type(fs), "copy", failing_copy)
    with pytest.raises(CheckpointError, match="connection reset") as failure:
        _dcp.publish_folder(temp, target)
    assert f"The complete new checkpoint is at {temp!r}" in str(failure.value)
    monkeypatch.undo()
    assert not _dcp.is_sharded_checkpoint(target)  # never a mix of the old and the new checkpoint
    with pytest.raises(CheckpointError, match="is not a sharded checkpoint"):
        _dcp.check_sharded_checkpoint(target)
    assert torch.equal(_dcp.read_entries(_dcp.check_sharded_checkpoint(temp), None)["w"], torch.full((4,), 2.0))
    _dcp.publish_folder(temp, target)  # publishing again from the kept folder completes the save
    assert torch.equal(_dcp.read_entries(target, None)["w"], torch.full((4,), 2.0))
    assert not fs.exists(temp[len("memory://") :])


def test_sharded_url_refusals(memory_url: str) -> None:
    from fabric_lite.runtime.checkpoint import folders as _dcp

    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{memory_url[len('memory://') :]}/logs/notes.txt", b"keep me")
    with pytest.raises(CheckpointError, match="a folder that is not a checkpoint exists there"):
        _dcp.make_temp_folder(f"{memory_url}/logs")
    with pytest.raises(CheckpointError, match="names a bucket"):
        _dcp.make_temp_folder("memory://")
    if _has("s3fs"):
        with pytest.raises(CheckpointError, match="names a bucket"):
            _dcp.make_temp_folder("s3://just-a-bucket", {"anon": True})
    with pytest.raises(CheckpointError, match=r"holds notes\.txt"):
        _dcp.check_sharded_checkpoint(f"{memory_url}/logs")
    with pytest.raises(CheckpointError, match="is a file"):
        _dcp.check_sharded_checkpoint(f"{memory_url}/logs/notes.txt")


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
