"""Checkpoints in this process: ``Fabric.save``/``load``/``load_raw`` and the safe file layer (RELIABILITY.md 15-19).

* Round trips on one device: objects restored in place, plain values written back, the remainder returned; strict
  loading names every missing key, ``strict=False`` restores what is there, and ``filter`` keeps chosen entries.
* Loading is safe: ``weights_only`` by default, never a silent retry without it (a malicious pickle's payload never
  runs), and a clear error naming the path for empty, truncated, foreign or missing files and for a folder.
* Saving is atomic: whatever fails (pickling, an interrupt, a full disk, a path under a file or on a folder), the
  previous file is byte-identical and no temporary file is left; a new file gets the permissions the umask allows.

The checks that start processes are in tests/distributed/test_checkpoints.py.
"""

from __future__ import annotations

import copy
import errno
import os
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.runtime.checkpoint import CheckpointError, atomic_save, safe_load


def _fabric():
    return Fabric(accelerator="cpu", devices=1)


def _setup(fabric, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    return fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.01))


def _train_a_step(fabric, fmodel, foptimizer):
    foptimizer.zero_grad()
    fabric.backward(fmodel(torch.randn(4, 3)).pow(2).sum())
    foptimizer.step()


def _assert_state_dicts_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            _assert_state_dicts_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_state_dicts_equal(x, y)
    else:
        assert a == b


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


class Stateful:
    """Not a module or optimizer, but has state_dict/load_state_dict: saved and restored through them."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class Trusted:
    """A plain Python object: weights_only refuses it, weights_only=False loads it."""

    def __init__(self, payload: str) -> None:
        self.payload = payload


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this object refuses to be pickled")


class Interrupting:
    def __reduce__(self):
        raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------- round trips
def test_save_load_round_trip(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    _train_a_step(fabric, fmodel, foptimizer)
    path = tmp_path / "ckpt.pt"
    fabric.save(path, {"model": fmodel, "optimizer": foptimizer, "step": 5, "extra": [1, 2], "counter": Stateful(9)})
    expected_model = copy.deepcopy(fmodel.state_dict())
    expected_optimizer = copy.deepcopy(foptimizer.state_dict())

    other_model, other_optimizer = _setup(fabric, seed=1)
    weight = other_model.module[0].weight
    counter = Stateful(0)
    state = {"model": other_model, "optimizer": other_optimizer, "step": 0, "counter": counter}
    remainder = fabric.load(path, state)

    _assert_state_dicts_equal(other_model.state_dict(), expected_model)
    _assert_state_dicts_equal(other_optimizer.state_dict(), expected_optimizer)
    assert other_model.module[0].weight is weight  # restored in place
    assert state["model"] is other_model and state["optimizer"] is other_optimizer and state["counter"] is counter
    assert counter.value == 9
    assert state["step"] == 5  # plain values are written back into the dict
    assert remainder == {"extra": [1, 2]}  # what the file has and the state did not ask for
    # both continue identically
    torch.manual_seed(3)
    _train_a_step(fabric, fmodel, foptimizer)
    torch.manual_seed(3)
    _train_a_step(fabric, other_model, other_optimizer)
    _assert_state_dicts_equal(other_model.state_dict(), fmodel.state_dict())


def test_saved_file_holds_state_dicts_without_wrapper_prefixes(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    fabric.save(tmp_path / "c.pt", {"model": fmodel, "optimizer": foptimizer, "step": 5})
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert sorted(raw) == ["model", "optimizer", "step"]
    assert list(raw["model"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert set(raw["optimizer"]) == {"state", "param_groups"}


def test_load_without_state_returns_the_whole_checkpoint(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    fabric.save(tmp_path / "c.pt", {"model": fmodel, "step": 5, "extra": [1, 2]})
    everything = fabric.load(tmp_path / "c.pt")
    assert sorted(everything) == ["extra", "model", "step"]
    _assert_state_dicts_equal(everything["model"], fmodel.state_dict())
    assert fabric.load(tmp_path / "c.pt", None)["step"] == 5


def test_strict_load_names_every_missing_key(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    path = tmp_path / "c.pt"
    fabric.save(path, {"model": fmodel, "step": 5})
    state = {"model": fmodel, "optimizer": foptimizer, "epoch": 0, "step": 0}
    with pytest.raises(KeyError) as info:
        fabric.load(path, state)
    message = str(info.value)
    assert "optimizer" in message and "epoch" in message and "strict=False" in message
    assert str(path) in message
    # Lightning's words first (its tests, and scripts that parse the message, look for them)
    assert message.startswith("\"The requested state contains a key 'optimizer' that does not exist in the loaded")
    assert state["step"] == 0  # nothing was half-loaded


def test_non_strict_load_restores_what_is_there(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    path = tmp_path / "c.pt"
    fabric.save(path, {"model": fmodel, "step": 5, "extra": 1})
    other, other_optimizer = _setup(fabric, seed=1)
    state = {"model": other, "optimizer": other_optimizer, "epoch": 7}
    remainder = fabric.load(path, state, strict=False)
    assert remainder == {"step": 5, "extra": 1}
    assert state["epoch"] == 7 and state["optimizer"] is other_optimizer
    _assert_state_dicts_equal(other.state_dict(), fmodel.state_dict())


def test_load_raw_of_a_plain_state_dict(tmp_path):
    fabric = _fabric()
    source = nn.Linear(3, 2)
    torch.save(source.state_dict(), tmp_path / "raw.pt")
    fmodel, foptimizer = _linear_setup(fabric)
    fabric.load_raw(tmp_path / "raw.pt", fmodel)
    _assert_state_dicts_equal(fmodel.state_dict(), source.state_dict())
    plain = nn.Linear(3, 2)
    fabric.load_raw(tmp_path / "raw.pt", plain)  # an unwrapped module works too
    _assert_state_dicts_equal(plain.state_dict(), source.state_dict())
    # an optimizer's raw state dict
    source_optimizer = torch.optim.SGD(source.parameters(), lr=0.25, momentum=0.5)
    source.weight.grad = torch.ones_like(source.weight)
    source.bias.grad = torch.ones_like(source.bias)
    source_optimizer.step()
    torch.save(source_optimizer.state_dict(), tmp_path / "opt.pt")
    fabric.load_raw(tmp_path / "opt.pt", foptimizer)
    _assert_state_dicts_equal(foptimizer.state_dict(), source_optimizer.state_dict())
    # strict=False allows a partial state dict
    torch.save({"weight": torch.zeros(2, 3)}, tmp_path / "partial.pt")
    with pytest.raises(RuntimeError, match="bias"):
        fabric.load_raw(tmp_path / "partial.pt", fmodel)
    fabric.load_raw(tmp_path / "partial.pt", fmodel, strict=False)
    assert torch.equal(fmodel.weight, torch.zeros(2, 3))


def _linear_setup(fabric):
    model = nn.Linear(3, 2)
    return fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.5))


def test_filter_keeps_only_chosen_entries(tmp_path):
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    path = tmp_path / "c.pt"
    fabric.save(
        path,
        {"model": fmodel, "optimizer": foptimizer, "step": 5},
        filter={"model": lambda name, value: name.endswith("weight"), "optimizer": lambda name, value: name != "state"},
    )
    raw = torch.load(path, weights_only=True)
    assert list(raw["model"]) == ["0.weight", "2.weight"]
    assert list(raw["optimizer"]) == ["param_groups"]
    assert raw["step"] == 5
    # a filtered checkpoint loads back with strict=False on the module
    other, _ = _setup(fabric, seed=1)
    other.load_state_dict(raw["model"], strict=False)
    assert torch.equal(other.module[0].weight, fmodel.module[0].weight)


# ---------------------------------------------------------------------------------------------- safe loading
class Payload:
    """Unpickling this runs ``os.mkdir(marker)``: the classic malicious checkpoint."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_malicious_file_is_refused_and_its_payload_never_runs(tmp_path, monkeypatch):
    marker = tmp_path / "PAYLOAD_RAN"
    path = tmp_path / "evil.ckpt"
    torch.save({"model": {}, "x": Payload(str(marker))}, path)
    assert not marker.exists()

    calls = []
    real_load = torch.load

    def counting_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    fabric = _fabric()
    for attempt in (
        lambda: fabric.load(path),
        lambda: fabric.load(path, {"model": nn.Linear(1, 1)}),
        lambda: fabric.load(path, weights_only=True),
        lambda: fabric.load_raw(path, nn.Linear(1, 1)),
    ):
        calls.clear()
        with pytest.raises(CheckpointError) as info:
            attempt()
        assert str(path) in str(info.value) and "weights_only=False" in str(info.value)
        assert calls == [True], "fabric_lite must call torch.load once, with weights_only=True, and never retry"
        assert not marker.exists(), "the payload ran"
    # the payload is real: loading it unsafely does run it (which is why fabric_lite never does so by itself)
    monkeypatch.undo()
    torch.load(path, weights_only=False)
    assert marker.is_dir()


def test_weights_only_false_loads_a_trusted_file(tmp_path):
    path = tmp_path / "trusted.ckpt"
    torch.save({"obj": Trusted("hello"), "step": 2}, path)
    fabric = _fabric()
    with pytest.raises(CheckpointError, match="weights_only=False"):
        fabric.load(path)
    state = {"obj": None, "step": 0}
    assert fabric.load(path, state, weights_only=False) == {}
    assert isinstance(state["obj"], Trusted) and state["obj"].payload == "hello" and state["step"] == 2


def _truncated(path: Path, tmp_path: Path) -> None:
    fabric = _fabric()
    fmodel, foptimizer = _setup(fabric, seed=0)
    fabric.save(tmp_path / "whole.pt", {"model": fmodel, "optimizer": foptimizer})
    data = (tmp_path / "whole.pt").read_bytes()
    path.write_bytes(data[: len(data) // 2])


_CORRUPT_FILES = {
    "empty": lambda path, tmp: path.write_bytes(b""),
    "truncated": _truncated,
}


# Non-checkpoint contents on which raw torch.load(weights_only=True) fails in different ways; each must become a
# CheckpointError that calls the file corrupt (never a bare KeyError/IndexError/struct.error, and never the advice
# to retry with weights_only=False, which is for trusted files that hold Python objects, not for garbage).
_FOREIGN_FILES = {
    # torch: UnpicklingError "Unsupported operand 194" -> fabric_lite reports it as a refused *safe* file
    "random bytes": random.Random(0).randbytes(1000),
    # torch: UnpicklingError "Unsupported operand 0", reported the same way
    "one zero byte": b"\x00",
    # torch: KeyError
    "text": b"hello world, this is not a checkpoint\n" * 10,
    # torch: IndexError "pop from empty list"
    "pickle STOP only": b".",
    # torch: struct.error "unpack requires a buffer of 4 bytes"
    "short BININT": b"J\x01",
}


@pytest.mark.parametrize("kind", sorted(_CORRUPT_FILES))
def test_corrupt_file_raises_naming_the_path(tmp_path, kind):
    path = tmp_path / "bad.ckpt"
    _CORRUPT_FILES[kind](path, tmp_path)
    with pytest.raises(CheckpointError) as info:
        _fabric().load(path)
    message = str(info.value)
    assert str(path) in message
    assert "incomplete or corrupt" in message
    if kind == "empty":
        assert "empty" in message


@pytest.mark.parametrize("kind", list(_FOREIGN_FILES))
def test_foreign_file_raises_naming_the_path(tmp_path, kind):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(_FOREIGN_FILES[kind])
    with pytest.raises(CheckpointError) as info:
        _fabric().load(path)
    message = str(info.value)
    assert str(path) in message and "corrupt" in message
    assert "weights_only=False" not in message


def test_folder_instead_of_a_file(tmp_path):
    folder = tmp_path / "a_folder.ckpt"
    folder.mkdir()
    with pytest.raises(CheckpointError) as info:
        _fabric().load(folder)
    assert str(folder) in str(info.value) and "folder" in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.ckpt"
    with pytest.raises(FileNotFoundError) as info:
        _fabric().load(path)
    assert str(path) in str(info.value)
    with pytest.raises(FileNotFoundError):
        _fabric().load_raw(path, nn.Linear(1, 1))


# ---------------------------------------------------------------------------------------------- atomic saving
def _previous_checkpoint(tmp_path: Path) -> tuple[Fabric, object, Path, bytes]:
    fabric = _fabric()
    fmodel, _ = _setup(fabric, seed=0)
    path = tmp_path / "ckpt.pt"
    fabric.save(path, {"model": fmodel, "step": 1})
    return fabric, fmodel, path, path.read_bytes()


def _assert_previous_intact(path: Path, before: bytes, fabric: Fabric) -> None:
    assert path.read_bytes() == before
    assert fabric.load(path)["step"] == 1
    assert _only(path.parent) == [path.name], "a temporary file was left behind"


def test_failed_pickling_leaves_the_previous_checkpoint(tmp_path):
    fabric, fmodel, path, before = _previous_checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as info:
        fabric.save(path, {"model": fmodel, "step": 2, "bad": Unpicklable()})
    assert str(path) in str(info.value) and "refuses to be pickled" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    _assert_previous_intact(path, before, fabric)


def test_interrupted_save_leaves_the_previous_checkpoint(tmp_path):
    fabric, fmodel, path, before = _previous_checkpoint(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        fabric.save(path, {"model": fmodel, "step": 2, "bad": Interrupting()})
    _assert_previous_intact(path, before, fabric)


def test_first_failed_save_leaves_nothing(tmp_path):
    with pytest.raises(CheckpointError):
        _fabric().save(tmp_path / "new.pt", {"bad": Unpicklable()})
    assert _only(tmp_path) == []


def test_path_under_a_regular_file(tmp_path):
    (tmp_path / "file.txt").write_text("I am a file")
    path = tmp_path / "file.txt" / "ckpt"
    with pytest.raises(CheckpointError) as info:
        _fabric().save(path, {"step": 1})
    assert str(path) in str(info.value)
    assert (tmp_path / "file.txt").read_text() == "I am a file"


def test_path_that_is_a_folder(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(CheckpointError) as info:
        _fabric().save(tmp_path / "taken", {"step": 1})
    assert str(tmp_path / "taken") in str(info.value)
    assert _only(tmp_path) == ["taken"] and _only(tmp_path / "taken") == []


class _DiskFullFile:
    """A file object whose writes fail with ENOSPC after ``budget`` bytes, like a disk that fills up."""

    def __init__(self, real, budget: int) -> None:
        self._real = real
        self._budget = budget

    def write(self, data) -> int:
        if len(data) > self._budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._budget -= len(data)
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_disk_full_leaves_the_previous_checkpoint(tmp_path, monkeypatch, where):
    fabric, fmodel, path, before = _previous_checkpoint(tmp_path)
    if where == "write":
        real_fdopen = os.fdopen
        monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _DiskFullFile(real_fdopen(fd, *a, **k), 200))
    elif where == "fsync":

        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", fsync)
    else:

        def replace(src, dst):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(CheckpointError) as info:
        fabric.save(path, {"model": fmodel, "step": 2, "big": torch.zeros(10_000)})
    assert str(path) in str(info.value)
    monkeypatch.undo()
    _assert_previous_intact(path, before, fabric)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_gets_the_usual_permissions(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        atomic_save({"step": 1}, tmp_path / "c.pt")
    finally:
        os.umask(previous)
    assert (tmp_path / "c.pt").stat().st_mode & 0o777 == mode


def test_missing_parent_folders_are_created(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "ckpt.pt"
    _fabric().save(path, {"step": 3})
    assert safe_load(path) == {"step": 3}
    assert _only(path.parent) == ["ckpt.pt"]


def test_relative_path_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fabric = _fabric()
    fabric.save("ckpt.pt", {"step": 4})
    assert fabric.load("ckpt.pt") == {"step": 4} and _only(tmp_path) == ["ckpt.pt"]


def test_overwrite_replaces_the_file(tmp_path):
    path = tmp_path / "c.pt"
    fabric = _fabric()
    fabric.save(path, {"step": 1})
    fabric.save(path, {"step": 2})
    assert fabric.load(path) == {"step": 2} and _only(tmp_path) == ["c.pt"]
