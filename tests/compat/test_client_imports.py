"""The private Lightning Fabric names that public clients import (litgpt's first; docs/migration.md ranks them),
provided at Lightning's paths with Lightning's behaviour: side by side with Lightning Fabric, and on their own for
what fabric_lite adds (``_lazy_load`` reads a tensor only when it is used, safely, and handles nested calls).

tests/compat/test_surface.py checks that each name exists with a compatible signature; this file checks what they do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fabric_lite.runtime.checkpoint import CheckpointError
from fabric_lite.utilities.load import _lazy_load, _materialize_tensors, _NotYetLoadedTensor
from tests.helpers.harness import base_env, lightning_python, run_python

PROBE = "tests/helpers/scripts/client_imports_probe.py"


def _probe(impl: str, folder: Path, python: str | None = None) -> dict:  # type: ignore[type-arg]
    folder.mkdir()
    done = run_python([PROBE, impl, str(folder)], python=python, env=base_env(), timeout=120)
    assert done.returncode == 0, done.output
    return json.loads(done.stdout.split("PROBE ", 1)[1])  # type: ignore[no-any-return]


@pytest.mark.compat
@pytest.mark.skipif(lightning_python() is None, reason="no Lightning venv: run .ci/setup (or set LIGHTNING_PYTHON)")
def test_the_names_do_what_lightnings_do(tmp_path: Path) -> None:
    theirs = _probe("lightning", tmp_path / "lightning", lightning_python())
    ours = _probe("fabric_lite", tmp_path / "fabric_lite")
    assert ours == theirs
    # and what they did is what the names promise
    assert (
        ours["lazy_is_not_yet"]
        and ours["lazy_plain"] == [7, ["a", "b"]]
        and ours["lazy_missing"] == "FileNotFoundError"
    )
    assert ours["has_meta"] and not ours["has_meta_after"] and ours["empty_init_draws_nothing"]
    assert ours["runif"][1][0] == ["torch>=99.0, " + torch.__version__ + " installed"] and ours["runif"][4][1] == {
        "standalone": True
    }
    assert ours["rng_roundtrip"] and ours["rank_zero_experiment"] == "real"


def test_lazy_load_reads_a_tensor_only_when_it_is_used(tmp_path: Path) -> None:
    """A 256 MiB checkpoint: opening it costs a few MiB of memory; each tensor is read when used, as in Lightning
    (where a 7B model's tensors are converted one at a time)."""
    code = (
        "import sys, torch\n"
        "from fabric_lite.utilities.load import _lazy_load\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * 4096 // 2**20\n"
        "torch.save({f'w{i}': torch.full((8, 2**20), float(i)) for i in range(8)}, sys.argv[1])\n"
        "start = rss()\n"
        "state = _lazy_load(sys.argv[1])\n"
        "opened = rss() - start\n"
        "first = state['w3']._load_tensor().sum().item()\n"
        "one = rss() - start\n"
        "total = sum(t._load_tensor().sum().item() for t in state.values())\n"
        "print('RSS', opened, one, rss() - start, first, total)\n"
    )
    done = run_python(["-c", code, str(tmp_path / "big.pt")], timeout=120)
    assert done.returncode == 0, done.output
    opened, one, everything, first, total = (float(v) for v in done.stdout.split("RSS ", 1)[1].split())
    assert first == 3 * 8 * 2**20 and total == sum(range(8)) * 8 * 2**20
    assert opened < 16, done.stdout  # MiB: the index only, not 256 MiB of tensors
    assert 28 <= one - opened <= 40, done.stdout  # one 32 MiB tensor read
    assert everything >= 250, done.stdout  # and all of them once all are used


def test_lazy_tensors_behave_as_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    torch.save({"model": module.state_dict(), "param": torch.nn.Parameter(torch.ones(2)), "n": 1}, tmp_path / "c.pt")
    state = _lazy_load(tmp_path / "c.pt")
    weight = state["model"]["weight"]
    assert isinstance(weight, _NotYetLoadedTensor) and repr(weight) == (
        "_NotYetLoadedTensor(shape=(3, 4), dtype=torch.float32)"
    )
    assert weight.shape == (3, 4) and weight.dtype == torch.float32 and weight.metatensor.is_meta and len(weight) == 3
    # nested arguments are read too (Lightning's recurses forever on torch.cat of a list)
    assert torch.equal(torch.cat([weight, weight]), torch.cat([module.weight, module.weight]).detach())
    assert torch.equal(torch.stack((weight,), dim=0)[0], module.weight.detach())
    assert isinstance(state["param"]._load_tensor(), torch.nn.Parameter)
    other = torch.nn.Linear(4, 3)
    other.load_state_dict(state["model"])
    assert torch.equal(other.weight, module.weight)
    plain = _materialize_tensors(state)
    assert type(plain["model"]["weight"]) is torch.Tensor and plain["n"] == 1


def test_lazy_load_refuses_python_objects_unless_trusted(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(2), "obj": Path("x")}, tmp_path / "obj.pt")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        _lazy_load(tmp_path / "obj.pt")
    assert _lazy_load(tmp_path / "obj.pt", weights_only=False)["obj"] == Path("x")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"junk\.pt"):
        _lazy_load(tmp_path / "junk.pt")
