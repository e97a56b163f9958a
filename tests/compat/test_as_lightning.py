"""The import hook of ``fabric_lite.as_lightning``: code written against Lightning Fabric runs on fabric_lite with
its imports unchanged, in every process of a job, and the real Lightning (where installed) keeps its own Fabric.

Every check runs in a fresh interpreter: the hook changes what ``import lightning`` means for a whole process.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, base_env, lightning_python, run_python

SCRIPT = "tests/helpers/scripts/as_lightning_ddp.py"

# what a client sees: run under the hook, prints one JSON line
CLIENT_VIEW = r"""
import json, sys
import lightning as L
import lightning.fabric, lightning_fabric
import fabric_lite, fabric_lite.strategies, fabric_lite.utilities.load
from lightning.fabric.strategies import DDPStrategy, FSDPStrategy
from lightning_fabric.utilities.load import _lazy_load, _NotYetLoadedTensor
from lightning.fabric.utilities.init import _materialize_meta_tensors
from lightning.fabric.plugins.precision.bitsandbytes import _BITSANDBYTES_AVAILABLE
import lightning.fabric.utilities.load as load_module
out = {
    "Fabric": L.Fabric is fabric_lite.Fabric is lightning.fabric.Fabric is lightning_fabric.Fabric,
    "seed_everything": L.seed_everything is fabric_lite.seed_everything,
    "ddp": DDPStrategy is fabric_lite.strategies.DDPStrategy,
    "fsdp": FSDPStrategy is fabric_lite.strategies.FSDPStrategy,
    "same_module": load_module is fabric_lite.utilities.load is sys.modules["lightning_fabric.utilities.load"],
    "spec_kept": load_module.__spec__.name,
    "version": [lightning.fabric.__version__, lightning_fabric.__version__, lightning_fabric.__fabric_lite_version__],
    "lazy": _lazy_load is fabric_lite.utilities.load._lazy_load,
}
try:
    import lightning.fabric.utilities.no_such_module
except ModuleNotFoundError as err:
    out["missing"] = [err.name, str(err)]
print("VIEW " + json.dumps(out))
"""


def _view(done) -> dict:  # type: ignore[no-untyped-def]
    assert done.returncode == 0, done.output
    lines = [line for line in done.stdout.splitlines() if line.startswith("VIEW ")]
    assert len(lines) == 1, done.output
    return json.loads(lines[0][len("VIEW ") :])  # type: ignore[no-any-return]


def _check_client_view(view: dict) -> None:  # type: ignore[type-arg]
    assert (
        view["Fabric"]
        and view["seed_everything"]
        and view["ddp"]
        and view["fsdp"]
        and view["same_module"]
        and view["lazy"]
    )
    assert view["spec_kept"] == "fabric_lite.utilities.load"  # the alias did not take over fabric_lite's module
    assert view["version"][:2] == ["2.6.6", "2.6.6"]
    import fabric_lite

    assert view["version"][2] == fabric_lite.__version__
    name, message = view["missing"]
    assert name == "lightning.fabric.utilities.no_such_module"
    assert "fabric_lite has no counterpart" in message and "docs/migration.md" in message


def test_the_command_line_serves_lightning_fabric_from_fabric_lite() -> None:
    _check_client_view(_view(run_python(["-m", "fabric_lite.as_lightning", "-c", CLIENT_VIEW], timeout=90)))


def test_the_environment_variable_turns_the_hook_on_at_start_up() -> None:
    """``FABRIC_LITE_AS_LIGHTNING=1`` alone: the ``.pth`` file that installing fabric_lite put in site-packages."""
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert (site / "fabric_lite-as-lightning.pth").is_file(), "run .ci/setup (pip install -e . installs it)"
    env = base_env({"FABRIC_LITE_AS_LIGHTNING": "1"})
    _check_client_view(_view(run_python(["-c", CLIENT_VIEW], env=env, timeout=90)))
    off = run_python(["-c", "import lightning"], env=base_env({"FABRIC_LITE_AS_LIGHTNING": "0"}), timeout=60)
    assert off.returncode != 0 and "No module named 'lightning'" in off.stderr, off.output


def test_python_dash_m_runs_a_lightning_module_path_as_fabric_lites() -> None:
    """``python -m lightning.fabric.utilities.consolidate_checkpoint`` (Lightning's documented command) runs
    fabric_lite's module of that path under the hook."""
    env = base_env({"FABRIC_LITE_AS_LIGHTNING": "1"})
    done = run_python(["-m", "lightning.fabric.utilities.consolidate_checkpoint", "--help"], env=env, timeout=90)
    assert done.returncode == 0 and "python -m fabric_lite.utilities.consolidate_checkpoint" in done.stdout, done.output


def test_logging_goes_through_lightnings_loggers_and_a_deleted_module_imports_afresh() -> None:
    """Under the hook a program's settings for Lightning's loggers apply to what fabric_lite logs; and a module
    deleted from sys.modules and imported again is executed again (its import-time state computed anew), as
    everywhere in Python."""
    code = (
        "import logging, os, sys\n"
        "records = []\n"
        "handler = logging.Handler(); handler.emit = records.append\n"
        "logging.getLogger('lightning.fabric').addHandler(handler)\n"
        "logging.getLogger('lightning.fabric').setLevel(logging.INFO)\n"
        "from lightning.fabric import seed_everything\n"
        "seed_everything(7)\n"
        "print('LOGGED', [(r.name, r.getMessage()) for r in records])\n"
        "from lightning.fabric.utilities.rank_zero import rank_zero_only as before\n"
        "del sys.modules['lightning.fabric.utilities.rank_zero']\n"
        "os.environ['RANK'] = '3'\n"
        "from lightning.fabric.utilities.rank_zero import rank_zero_only as after\n"
        "print('RANKS', before.rank, after.rank)\n"
    )
    done = run_python(["-c", code], env=base_env({"FABRIC_LITE_AS_LIGHTNING": "1"}), timeout=90)
    assert done.returncode == 0, done.output
    assert "LOGGED [('lightning.fabric.utilities.seed', 'Seed set to 7')]" in done.stdout, done.output
    assert "RANKS 0 3" in done.stdout, done.output


def test_one_line_of_python_and_uninstall() -> None:
    code = (
        "import fabric_lite.as_lightning as hook, os, sys\n"
        "hook.install()\n" + CLIENT_VIEW + "\n"
        "assert hook.is_installed() and os.environ['FABRIC_LITE_AS_LIGHTNING'] == '1'\n"
        "hook.install()  # again: nothing happens\n"
        "assert sum(type(f).__name__ == 'LightningFinder' for f in sys.meta_path) == 1\n"
        "hook.uninstall()\n"
        "assert not hook.is_installed() and 'FABRIC_LITE_AS_LIGHTNING' not in os.environ\n"
        "try:\n    import lightning\nexcept ModuleNotFoundError:\n    print('UNINSTALLED')\n"
    )
    done = run_python(["-c", code], timeout=90)
    _check_client_view(_view(done))
    assert "UNINSTALLED" in done.stdout, done.output


def test_without_the_real_lightning_its_other_names_say_what_to_install() -> None:
    code = (
        "import lightning as L\n"
        "try:\n    import lightning.pytorch\nexcept ModuleNotFoundError as err:\n    print('PYTORCH', err)\n"
        "try:\n    L.Trainer\nexcept AttributeError as err:\n    print('TRAINER', err)\n"
        "print('ALL', sorted(L.__all__), L.__version__)\n"
    )
    done = run_python(["-m", "fabric_lite.as_lightning", "-c", code], timeout=90)
    assert done.returncode == 0, done.output
    assert "PYTORCH 'lightning.pytorch' is part of the real Lightning package, which is not installed" in done.stdout
    assert "TRAINER 'lightning.Trainer' is part of the real Lightning package" in done.stdout
    assert "pip install --no-deps lightning==2.6.6" in done.stdout
    assert "ALL ['Fabric', 'seed_everything'] 2.6.6" in done.stdout


def test_installing_after_lightning_was_imported_is_refused() -> None:
    code = (
        "import sys, types\n"
        "sys.modules['lightning_fabric'] = types.ModuleType('lightning_fabric')  # as if the real one was imported\n"
        "import fabric_lite.as_lightning as hook\n"
        "try:\n    hook.install()\nexcept RuntimeError as err:\n    print('REFUSED', err)\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.output
    assert "REFUSED fabric_lite.as_lightning.install() came too late: lightning_fabric is imported already" in (
        done.stdout
    )


def test_usage_without_a_program() -> None:
    done = run_python(["-m", "fabric_lite.as_lightning"], timeout=60)
    assert done.returncode == 2 and "usage: python -m fabric_lite.as_lightning (-m MODULE | -c CODE | SCRIPT)" in (
        done.stderr
    ), done.output


def _two_ranks(done) -> None:  # type: ignore[no-untyped-def]
    assert done.returncode == 0, done.output
    ranks = sorted(re.findall(r"RANK \d \w+ \w+ [\d.]+", done.stdout))
    assert ranks == ["RANK 0 fabric_lite DDPStrategy 3.0", "RANK 1 fabric_lite DDPStrategy 3.0"], done.output


@pytest.mark.distributed
@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["ddp", "ddp_spawn"])
def test_every_process_of_a_job_gets_the_hook(how: str) -> None:
    """The launchers' children (the script run again, or spawned) inherit it: they import `lightning` too."""
    _two_ranks(run_python(["-m", "fabric_lite.as_lightning", SCRIPT, how], timeout=180))
    env = base_env({"FABRIC_LITE_AS_LIGHTNING": "1"})
    _two_ranks(run_python([SCRIPT, how], env=env, timeout=180))


@pytest.mark.distributed
@pytest.mark.timeout(200)
@pytest.mark.parametrize("form", ["script", "module"])
def test_fabric_lite_run_as_lightning(form: str) -> None:
    program = [SCRIPT, "cli"] if form == "script" else ["-m", "tests.helpers.scripts.as_lightning_ddp", "cli"]
    args = ["-m", "fabric_lite", "run", "--accelerator=cpu", "--devices=2", "--as-lightning", *program]
    _two_ranks(run_python(args, timeout=180, cwd=REPO))


@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_torchrun_workers_get_the_hook_from_the_environment() -> None:
    env = base_env({"FABRIC_LITE_AS_LIGHTNING": "1"})
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT, "ddp"]
    _two_ranks(run_python(args, env=env, timeout=180))


# the real pytorch_lightning keeps the real Lightning Fabric underneath while the client gets fabric_lite's
REAL_LIGHTNING = r"""
import json, sys
import fabric_lite.as_lightning
fabric_lite.as_lightning.install()
import torch, lightning_fabric, pytorch_lightning as pl
import pytorch_lightning.trainer.connectors.accelerator_connector as connector
import fabric_lite

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), data)
print("REAL " + json.dumps({
    "client": lightning_fabric.Fabric is fabric_lite.Fabric,
    "internal": connector.TorchElasticEnvironment.__module__,
    "steps": trainer.global_step,
    "no_real_under_client_names": sorted(
        k for k in sys.modules
        if k.startswith("lightning_fabric") and sys.modules[k].__name__.startswith("_original_")
    ),
}))
"""


@pytest.mark.compat
@pytest.mark.skipif(lightning_python() is None, reason="no Lightning venv: run .ci/setup (or set LIGHTNING_PYTHON)")
def test_the_real_trainer_runs_on_the_real_fabric_beside_the_hook() -> None:
    done = run_python(["-c", REAL_LIGHTNING], python=lightning_python(), timeout=120)
    assert done.returncode == 0, done.output
    line = next(line for line in done.stdout.splitlines() if line.startswith("REAL "))
    real = json.loads(line[len("REAL ") :])
    assert real["client"] and real["steps"] == 2 and real["no_real_under_client_names"] == []
    assert real["internal"].startswith("_original_lightning_fabric."), real
