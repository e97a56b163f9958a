"""Misuse of the public API that needs processes of its own to show (RELIABILITY.md case 14).

* A ``ddp_spawn`` script without an ``if __name__ == "__main__":`` guard fails promptly with an error that names the
  guard, and its launch never returns.
* ``test_lightning_raises_the_same_classes`` runs the inputs of tests/unit/test_misuse.py under Lightning Fabric and
  checks that it raises the classes in ``LIGHTNING`` (skipped without its venv: run ``.ci/setup`` or set
  ``LIGHTNING_PYTHON``).

The checks that start no process are in tests/unit/test_misuse.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers.harness import lightning_python
from tests.unit.test_misuse import LIGHTNING

_UNGUARDED_SCRIPT = """
import torch
from fabric_lite import Fabric

def train(fabric):
    return fabric.global_rank

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
fabric.launch(train)
print("LAUNCH RETURNED")
"""


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_spawn_script_without_main_guard_fails_fast(tmp_path):
    from tests.helpers.harness import run_python

    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED_SCRIPT)
    done = run_python([str(script)], timeout=45, cwd=tmp_path)
    assert done.returncode != 0, done.output
    assert "LAUNCH RETURNED" not in done.stdout
    assert '__name__ == "__main__"' in done.stderr, done.output
    assert done.seconds < 30, f"took {done.seconds:.1f} s\n{done.output}"


# ---------------------------------------------------------------------------------------------- against Lightning
_LIGHTNING_SCRIPT = r"""
import json, multiprocessing, warnings
warnings.simplefilter("ignore")
import torch
from torch import nn
from torch.utils.data import DataLoader
from lightning_fabric import Fabric
from lightning_fabric.utilities.seed import seed_everything

out = {}
def check(case, fn):
    try:
        fn()
        out[case] = None
    except BaseException as err:
        out[case] = type(err).__name__

def mo():
    m = nn.Linear(2, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)

f = Fabric(accelerator="cpu", devices=1)
fm, fo = f.setup(*mo())
check("setup twice", lambda: f.setup(fm))
check("setup wrapped optimizer", lambda: f.setup(nn.Linear(2, 2), fo))
check("setup_module twice", lambda: f.setup_module(f.setup_module(nn.Linear(2, 2))))
check("setup_optimizers none", lambda: f.setup_optimizers())
check("setup_optimizers twice", lambda: f.setup_optimizers(fo))
check("setup_optimizers non-optimizer", lambda: f.setup_optimizers({"lr": 0.1}))
check("setup_dataloaders empty", lambda: f.setup_dataloaders())
check("setup_dataloaders non-DataLoader", lambda: f.setup_dataloaders([1, 2, 3]))
check("setup_dataloaders twice", lambda: f.setup_dataloaders(f.setup_dataloaders(DataLoader(range(4)))))
check("foreign optimizer", lambda: f.setup(nn.Linear(2, 2), torch.optim.SGD(nn.Linear(3, 3).parameters(), lr=0.1)))
check("backward before setup",
      lambda: Fabric(accelerator="cpu", devices=1).backward((torch.ones(2, requires_grad=True) * 2).sum()))
check("no_backward_sync unwrapped", lambda: f.no_backward_sync(nn.Linear(2, 2)))
check("clip both", lambda: f.clip_gradients(fm, fo, clip_val=0.5, max_norm=2.0))
check("clip neither", lambda: f.clip_gradients(fm, fo))
def no_args():
    return 1
check("launch non-callable", lambda: f.launch(no_args()))
check("launch no-argument function", lambda: f.launch(no_args))
check("launch() for spawn", lambda: Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").launch())
check("setup before launch", lambda: Fabric(accelerator="cpu", devices=2, strategy="ddp").setup(nn.Linear(2, 2)))
check("all_reduce before launch",
      lambda: Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").all_reduce(torch.tensor(1.0)))
check("barrier before launch", lambda: Fabric(accelerator="cpu", devices=2, strategy="ddp").barrier())
check("seed -1", lambda: seed_everything(-1))
check("seed 2**32", lambda: seed_everything(2**32))
check("seed 'abc'", lambda: seed_everything("abc"))
check("seed '1.5'", lambda: seed_everything("1.5"))
check("save non-dict", lambda: f.save("{folder}/a.ckpt", [fm]))
check("save filter non-dict", lambda: f.save("{folder}/b.ckpt", {{"model": fm}}, filter=[1]))
keep_all = {{"nope": lambda k, v: True}}
check("save filter unknown key", lambda: f.save("{folder}/c.ckpt", {{"model": fm}}, filter=keep_all))
check("save filter non-callable", lambda: f.save("{folder}/d.ckpt", {{"model": fm}}, filter={{"model": 3}}))
print("RESULT" + json.dumps(out))
"""


def _lightning_python() -> str | None:
    return lightning_python()


@pytest.mark.compat
@pytest.mark.timeout(60)
@pytest.mark.skipif(
    _lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)"
)
def test_lightning_raises_the_same_classes(tmp_path):
    """The LIGHTNING table above is what Lightning really raises (so _expect compares against real behaviour)."""
    script = _LIGHTNING_SCRIPT.replace("{folder}", str(tmp_path)).replace("{{", "{").replace("}}", "}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PL_", "FABRIC_LITE_"))}
    done = subprocess.run(
        [_lightning_python(), "-c", script], capture_output=True, text=True, timeout=50, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    observed = json.loads(line[len("RESULT") :])
    assert observed == LIGHTNING
