"""Lightning Fabric's own test suite passes on fabric_lite: every test of ``tests_fabric`` (Lightning 2.6.5's, kept in
``../shared/lightning-tests``) that passes on Lightning 2.6.6 here passes on fabric_lite through the import hook,
except those listed in :mod:`expected_differences`, each with its kind and reason.

The tests that pass on Lightning are a list kept in the project (:mod:`suite` says how it was computed), so this
tier runs the suite once, on fabric_lite only. It fails on a listed test that now passes, too: its entry is stale.

The tier is optional, like the litgpt tier: the whole suite skips it unless asked (``pytest -m lightning_tests``,
this file named, or ``FABRIC_LITE_LIGHTNING_TESTS=1``, which also makes a failed install an error). It builds
``.venv-lightning-tests`` with ``.ci/setup-lightning-tests`` on first use.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.harness import optional_venv, run_python
from tests.tiers.lightning_tests import suite
from tests.tiers.lightning_tests.expected_differences import compare, report

pytestmark = pytest.mark.lightning_tests

#: the share of the tests that pass on Lightning which must pass on fabric_lite (issue 31)
MIN_SHARE = 0.90
#: the run takes minutes and times nothing: it leaves the cores to the other test worker's timed jobs
NICE = 10


@pytest.fixture(scope="module")
def lightning_tests_python(request: pytest.FixtureRequest) -> str:
    """The Python of ``.venv-lightning-tests``, built by ``.ci/setup-lightning-tests`` when missing."""
    return optional_venv(
        request.config,
        marker="lightning_tests",
        variable="FABRIC_LITE_LIGHTNING_TESTS",
        module_file="test_lightning_suite.py",
        venv=suite.VENV,
        setup=".ci/setup-lightning-tests",
        probe="import fabric_lite, lightning, pytest_timeout, xdist, tensorboardX, click",
    )


# the suite's own bound is 300 s a test; the whole run takes 5-10 minutes on 2 busy cores
@pytest.mark.timeout(2700)
def test_lightnings_own_suite_passes_on_fabric_lite(
    lightning_tests_python: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("lightning_tests")
    cwd = suite.prepare(folder)
    outcomes_file = folder / "outcomes.json"
    argv = suite.command(lightning_tests_python, folder, [], workers=2)
    done = run_python(
        argv[1:],
        python=lightning_tests_python,
        env=suite.environment("fabric_lite", outcomes_file),
        cwd=cwd,
        timeout=2400,
        nice=NICE,
    )
    outcomes = suite.outcomes_of(outcomes_file)
    assert outcomes, f"the suite recorded no outcome\n{done.output[-20000:]}"
    reference = suite.read_reference()
    result = compare(reference, outcomes)
    text = report(reference, outcomes)
    print(f"Lightning's tests_fabric on fabric_lite: {suite.summary(outcomes)}\n{text}")
    assert not result.unexpected and not result.stale, f"{text}\n--- pytest's output (end) ---\n{done.stdout[-20000:]}"
    assert len(result.passed) >= MIN_SHARE * result.total, text


#: run under the hook and on Lightning: what ``from lightning.fabric import ...`` loads, and what then loads the rest
LAZY_TOP_LEVEL = r"""
import json, sys
from lightning.fabric import Fabric, seed_everything
seed_everything(42)
out = {"after_fabric": ["lightning.pytorch" in sys.modules, "torch._dynamo" in sys.modules]}
import lightning
out["version"] = lightning.__version__
out["after_version"] = "lightning.pytorch" in sys.modules
from lightning.pytorch import Trainer
out["trainer"] = lightning.Trainer is Trainer and lightning.pytorch.Trainer is Trainer
out["fabric"] = lightning.Fabric is Fabric
print("LAZY " + json.dumps(out))
"""


def test_lightning_fabric_alone_leaves_the_rest_of_lightning_unrun(lightning_tests_python: str) -> None:
    """Under the hook, a program that imports only Lightning Fabric's names does not pay for the real ``lightning``
    package's own code (the Trainer, ``LightningModule``, the real Lightning Fabric, ``torch._dynamo``); the first
    use of anything else of it (``lightning.__version__``, ``lightning.pytorch``) runs that code, as importing it
    would. And the INFO messages are printed as Lightning prints them."""
    seen = {}
    for impl in ("lightning", "fabric_lite"):
        env = suite.environment(impl, suite.VENV / "unused-outcomes.json")
        done = run_python(["-c", LAZY_TOP_LEVEL], python=lightning_tests_python, env=env, timeout=120)
        assert done.returncode == 0, done.output
        seen[impl] = (json.loads(done.stdout.split("LAZY ", 1)[1]), done.stderr)
    (lightning, lightning_err), (ours, our_err) = seen["lightning"], seen["fabric_lite"]
    assert lightning["after_fabric"] == [True, True]  # Lightning's own import runs all of it
    assert ours["after_fabric"] == [False, False]
    assert ours["version"] == lightning["version"] == "2.6.6" and ours["after_version"] and lightning["after_version"]
    assert ours["trainer"] and lightning["trainer"] and ours["fabric"] and lightning["fabric"]
    assert "Seed set to 42" in lightning_err.splitlines() and "Seed set to 42" in our_err.splitlines(), our_err
