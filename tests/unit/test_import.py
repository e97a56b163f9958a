"""``import fabric_lite`` has no side effects and imports no optional backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.harness import base_env, run_python

PROBE = r"""
import json, logging, os, sys
import torch
before_env = dict(os.environ)
before_modules = set(sys.modules)
root_handlers = list(logging.getLogger().handlers)
import fabric_lite
from fabric_lite import Fabric, is_wrapped, seed_everything
import fabric_lite.strategies, fabric_lite.plugins, fabric_lite.accelerators, fabric_lite.utilities.distributed
new = sorted(set(sys.modules) - before_modules)
print(json.dumps({
    "env_changed": sorted(k for k in set(os.environ) | set(before_env) if os.environ.get(k) != before_env.get(k)),
    "optional": [m for m in new if m.startswith(("torch._dynamo", "torch._inductor", "torch.distributed.fsdp",
                                                 "torch.utils.tensorboard", "tensorboard", "lightning", "accelerate"))],
    "third_party": sorted({m.split(".")[0] for m in new if not m.startswith(("fabric_lite", "torch"))
                           and m.split(".")[0] not in sys.stdlib_module_names and not m.startswith("_")}),
    "handlers_added": len(logging.getLogger().handlers) - len(root_handlers),
    "fabric_logger_handlers": len(logging.getLogger("fabric_lite").handlers),
    "all": fabric_lite.__all__,
}))
"""


def test_import_has_no_side_effects() -> None:
    done = run_python(["-c", PROBE], env=base_env({"PYTHONWARNINGS": "error"}), timeout=60)
    assert done.returncode == 0, done.output
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["env_changed"] == []
    assert report["optional"] == []
    assert report["handlers_added"] == 0 and report["fabric_logger_handlers"] == 0
    assert sorted(report["all"]) == ["Fabric", "__version__", "is_wrapped", "seed_everything"]
    # beyond torch and the standard library, only the declared runtime dependencies
    assert set(report["third_party"]) <= {"numpy", "typing_extensions"}, report["third_party"]


def test_import_emits_no_warning() -> None:
    done = run_python(["-W", "error", "-c", "import fabric_lite"], timeout=60)
    assert done.returncode == 0, done.output
    assert done.stderr == ""


WITHOUT_DISTRIBUTED = r"""
import torch
import torch.distributed as dist
for name in [n for n in vars(dist) if not n.startswith("__")]:  # a build of torch without distributed support
    delattr(dist, name)
dist.is_available = lambda: False
import fabric_lite, fabric_lite.strategies, fabric_lite.plugins, fabric_lite.loggers, fabric_lite.utilities
from fabric_lite.plugins.collectives import TorchCollective
from fabric_lite.utilities.distributed import group
from fabric_lite.utilities.types import ReduceOp
assert group.WORLD is None and ReduceOp.SUM != ReduceOp.MAX
fabric = fabric_lite.Fabric(accelerator="cpu", devices=1)
print("imported", fabric.world_size)
"""


def test_import_works_without_torch_distributed() -> None:
    """A torch built without distributed support (``USE_DISTRIBUTED=0``) still imports fabric_lite and runs one
    process."""
    done = run_python(["-c", WITHOUT_DISTRIBUTED], timeout=120)
    assert done.returncode == 0, done.output
    assert done.stdout.strip().splitlines()[-1] == "imported 1"


_SUBMODULE = """
import sys
import fabric_lite.strategies as strategies
assert "fabric_lite.strategies.single_xla" not in sys.modules  # not imported with the package
print(strategies.single_xla.__name__, strategies.fsdp.__name__)
try:
    strategies.no_such_module
except AttributeError as error:
    print(error)
"""


def test_a_lazy_packages_submodule_is_an_attribute_on_first_use() -> None:
    """As in a package that imports its modules eagerly (Lightning's): ``package.module`` without importing it."""
    done = run_python(["-c", _SUBMODULE], env=base_env(), timeout=120)
    assert done.returncode == 0, done.output
    assert done.stdout.splitlines() == [
        "fabric_lite.strategies.single_xla fabric_lite.strategies.fsdp",
        "module 'fabric_lite.strategies' has no attribute 'no_such_module'",
    ], done.output


LIGHTNING_IMPORT = r"""
import importlib, json, os, sys, warnings
import fabric_lite.as_lightning
fabric_lite.as_lightning.install()
import fabric_lite
seen = {"after_fabric_lite": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")}
import lightning.fabric
from lightning.fabric.utilities.warnings import PossibleUserWarning
seen["after_lightning_fabric"] = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK")
warnings.resetwarnings()
importlib.reload(lightning.fabric)  # executed again: set again
seen["after_reload"] = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    importlib.reload(lightning.fabric)  # reads POSSIBLE_USER_WARNINGS again, after the filters were reset
    warnings.warn("maybe a mistake", PossibleUserWarning)
seen["possible_user_warnings_shown"] = len(caught)
print(json.dumps(seen))
"""


@pytest.mark.parametrize(
    ("preset", "possible", "expected"),
    [
        pytest.param(None, None, {"after_lightning_fabric": "1", "after_reload": "1", "shown": 1}, id="unset"),
        pytest.param("0", "off", {"after_lightning_fabric": "0", "after_reload": "1", "shown": 0}, id="user-values"),
    ],
)
def test_lightning_fabric_under_the_hook_does_what_importing_lightning_does(
    preset: str | None, possible: str | None, expected: dict[str, Any]
) -> None:
    """``import lightning.fabric`` (fabric_lite under the hook) sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` unless it is
    set, and ``POSSIBLE_USER_WARNINGS=off`` silences ``PossibleUserWarning``, as Lightning's import does; importing
    ``fabric_lite`` itself sets nothing."""
    extra = {"PYTHONWARNINGS": "default"}
    if preset is not None:
        extra["PYTORCH_NVML_BASED_CUDA_CHECK"] = preset
    if possible is not None:
        extra["POSSIBLE_USER_WARNINGS"] = possible
    env = base_env(extra)
    if preset is None:
        env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    if possible is None:
        env.pop("POSSIBLE_USER_WARNINGS", None)
    done = run_python(["-c", LIGHTNING_IMPORT], env=env, timeout=120)
    assert done.returncode == 0, done.output
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after_fabric_lite"] == preset
    assert seen["after_lightning_fabric"] == expected["after_lightning_fabric"]
    assert seen["after_reload"] == expected["after_reload"]
    assert seen["possible_user_warnings_shown"] == expected["shown"]


def test_possible_user_warnings_off_silences_them_in_fabric_lite() -> None:
    code = (
        "import warnings\nfrom fabric_lite import Fabric\n"
        "from fabric_lite.utilities.warnings import PossibleUserWarning\n"
        "warnings.warn('maybe a mistake', PossibleUserWarning)\nprint('done')"
    )
    shown = run_python(["-W", "default", "-c", code], env=base_env({}), timeout=60)
    assert shown.returncode == 0 and "maybe a mistake" in shown.stderr, shown.output
    silenced = run_python(["-W", "default", "-c", code], env=base_env({"POSSIBLE_USER_WARNINGS": "0"}), timeout=60)
    assert silenced.returncode == 0 and "maybe a mistake" not in silenced.stderr, silenced.output
