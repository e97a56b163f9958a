"""Side by side with Lightning Fabric 2.6.6: the Lightning-named utilities give the same values.

tests/helpers/scripts/utilities_compat.py runs the same fixed inputs through ``lightning_fabric.utilities`` (in the
Lightning venv) and through ``fabric_lite.utilities``: ``Throughput`` sequences (with their errors), ``measure_flops``
of MLPs (on the meta device too), ``get_available_flops`` for a list of GPU names (torch's device queries answered by
the script), the random draws after ``pl_worker_init_function``, the shares of ``DistributedSamplerWrapper`` on every
rank, and a few small helpers. Each section is compared in its own test, so a difference names its section.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.harness import base_env, lightning_python, run_python

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)"
    ),
]
SCRIPT = "tests/helpers/scripts/utilities_compat.py"
_CACHE: dict[str, dict[str, Any]] = {}


def observe(impl: str) -> dict[str, Any]:
    if impl not in _CACHE:
        python = lightning_python() if impl == "lightning" else None
        done = run_python([SCRIPT], timeout=180, env=base_env({"COMPAT_IMPL": impl}), python=python)
        assert done.returncode == 0, f"{impl}:\n{done.output}"
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        _CACHE[impl] = json.loads(line[len("RESULT ") :])
    return _CACHE[impl]


@pytest.mark.parametrize(
    "section", ["throughput", "measure_flops", "available_flops", "worker_seed", "sampler_wrapper", "misc"]
)
def test_same_as_lightning(section: str) -> None:
    ours, theirs = observe("fabric_lite")[section], observe("lightning")[section]
    assert ours.keys() == theirs.keys()
    different = {key: (ours[key], theirs[key]) for key in ours if ours[key] != theirs[key]}
    assert not different, f"{section}: fabric_lite vs Lightning differ on {different}"


def test_the_comparison_sees_real_values() -> None:
    """Guards against a comparison of two empty or trivial outputs."""
    ours = observe("fabric_lite")
    assert ours["throughput"]["global_lengths_flops"][-1]["device/mfu"] == pytest.approx(0.11)
    assert ours["measure_flops"]["meta_forward"] == 2 * 8 * (32 * 64 + 64 * 10)
    flops = ours["available_flops"]
    assert flops["NVIDIA A100-SXM4-80GB|8|high|torch.float32"][0] == 156e12  # TF32 on Ampere
    assert flops["NVIDIA A100-SXM4-80GB|8|highest|torch.float32"][0] == 19.5e12
    assert flops["Tesla T4|7|high|torch.bfloat16"] == [None, ["'Tesla T4' does not support torch.bfloat16"]]
    assert flops["cpu"] == [None, 0]
    assert len({json.dumps(draws) for draws in ours["worker_seed"].values()}) == len(ours["worker_seed"])
    shares = ours["sampler_wrapper"]["11-3-[]"]
    drawn = [i for rank in shares for i in rank[0]]
    assert len(drawn) == 12 and set(drawn) == set(range(11))  # 11 indices padded to 4 per rank
