"""Checkpoints move between Lightning Fabric and fabric_lite in both directions, for every state Lightning saves: a
checkpoint written by one resumes on the other with the next losses of an uninterrupted run (two CPU processes: DDP
with one file, and sharded folders), and a loader's own ``state_dict`` is saved as exactly that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import base_env, lightning_python, run_python

SCRIPT = "tests/helpers/scripts/checkpoint_interchange.py"
IMPLS = ("lightning", "fabric_lite")

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(lightning_python() is None, reason="no Lightning venv: run .ci/setup (or set LIGHTNING_PYTHON)"),
]


def _jobs(impl: str, layout: str, mode: str, *paths: Path) -> list[dict[str, Any]]:
    """What the job observed for each checkpoint path, run one after another in one launch of two processes."""
    python = lightning_python() if impl == "lightning" else None
    env = base_env({"COMPAT_IMPL": impl})
    done = run_python([SCRIPT, layout, mode, *map(str, paths)], python=python, env=env, timeout=240 * len(paths))
    assert done.returncode == 0, f"{impl} {mode}\n{done.output}"
    observed = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("OBS ")]
    assert len(observed) == len(paths), done.output
    return observed


@pytest.mark.distributed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", ["ddp", "sharded"])
def test_a_checkpoint_resumes_on_the_other_library(layout: str, tmp_path: Path) -> None:
    written = {impl: tmp_path / f"{impl}-{layout}" for impl in IMPLS}
    uninterrupted = {impl: _jobs(impl, layout, "save", written[impl])[0] for impl in IMPLS}
    assert uninterrupted["fabric_lite"] == uninterrupted["lightning"]  # the same job, trained the same way
    resumed = {}
    for reader in IMPLS:  # each reader resumes both checkpoints in one launch, each in a Fabric of its own
        observed = _jobs(reader, layout, "resume", *(written[writer] for writer in IMPLS))
        resumed.update({(writer, reader): seen for writer, seen in zip(IMPLS, observed, strict=True)})
    for reader in IMPLS:  # each library resumes the other's checkpoint exactly as its own
        assert resumed[("lightning", reader)] == resumed[("fabric_lite", reader)], reader
    # fabric_lite resumes either checkpoint with the next losses (and weights, LR) of the uninterrupted run
    expected = {**uninterrupted["lightning"], "note": "mid-epoch"}
    assert resumed[("lightning", "fabric_lite")] == expected
    if layout == "ddp":
        assert resumed[("fabric_lite", "lightning")] == expected
    else:
        # Lightning's sharded load replaces a set-up loader by its saved state instead of restoring it
        # (ModelParallelStrategy.load_checkpoint: _move_state_into on the wrapper), so its resume restarts the epoch
        assert resumed[("fabric_lite", "lightning")]["losses"] != expected["losses"]


PLAIN = r"""
import os, sys, torch, warnings
from torch.utils.data import DataLoader
if os.environ["COMPAT_IMPL"] == "lightning":
    from lightning_fabric import Fabric
else:
    from fabric_lite import Fabric
mode, path = sys.argv[1], sys.argv[2]
fabric = Fabric(accelerator="cpu", devices=1)
loader = fabric.setup_dataloaders(DataLoader(list(range(8)), batch_size=2))
for _ in loader:
    pass
state = {"loader": loader, "step": 4}
if mode == "save":
    fabric.save(path, state)
    print("SAVED", type(torch.load(path, weights_only=False)["loader"]).__name__)
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = {"weights_only": False} if os.environ["COMPAT_IMPL"] == "fabric_lite" else {}
        fabric.load(path, {"loader": loader, "step": 0}, **kwargs)
    print("LOADED", [str(w.message) for w in caught if "dataloader" in str(w.message)])
"""


def test_a_plain_loader_in_a_checkpoint_does_not_break_either_reader(tmp_path: Path) -> None:
    """A ``DataLoader`` without a state of its own: Lightning pickles the object, fabric_lite records its epoch. Each
    reads the other's without an error (fabric_lite warns that Lightning's has no position to resume from)."""
    printed = {}
    for writer in IMPLS:
        python = lightning_python() if writer == "lightning" else None
        done = run_python(
            ["-c", PLAIN, "save", str(tmp_path / writer)], python=python, env=base_env({"COMPAT_IMPL": writer})
        )
        assert done.returncode == 0, done.output
        printed[writer] = done.stdout.split("SAVED ", 1)[1].strip()
    assert printed == {"lightning": "DataLoader", "fabric_lite": "dict"}
    for writer, reader in (("lightning", "fabric_lite"), ("fabric_lite", "lightning")):
        python = lightning_python() if reader == "lightning" else None
        done = run_python(
            ["-c", PLAIN, "load", str(tmp_path / writer)], python=python, env=base_env({"COMPAT_IMPL": reader})
        )
        assert done.returncode == 0, done.output
        warned = done.stdout.split("LOADED ", 1)[1].strip()
        assert ("starts again from the first epoch" in warned) == (reader == "fabric_lite"), done.output
