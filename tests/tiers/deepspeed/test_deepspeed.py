"""``strategy="deepspeed*"``: what needs no DeepSpeed (registry, plan, config, precision, argument checks, the
missing-library and version errors) runs everywhere; the ``deepspeed`` tier runs real 2-process gloo jobs on the CPU
with the Python of ``.venv-deepspeed``.

The tier is optional, like the S3 and MPI tiers: the whole suite skips it (saying how to run it) unless asked::

    .venv/bin/python -m pytest -q -m deepspeed tests/tiers/deepspeed/test_deepspeed.py   # the tier alone
    FABRIC_LITE_DEEPSPEED=1 ...   # in the whole suite; a DeepSpeed that cannot be installed is then a failure
    FABRIC_LITE_DEEPSPEED=0 ...   # skip without trying

When asked, it builds ``.venv-deepspeed`` with ``.ci/setup-deepspeed`` if it is missing (torch pinned, then
``DS_BUILD_OPS=0 pip install deepspeed==0.19.8``; skipped, with the first error, when that fails). No job compiles a
DeepSpeed op: torch's optimizers only (``"zero_force_ds_cpu_optimizer": false`` with offload), and the strategy leaves
out the shared-memory all-reduce extension on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite._plan import Machine, resolve_plan
from fabric_lite.plugins.precision import DeepSpeedPrecision, DoublePrecision, HalfPrecision, MixedPrecision
from fabric_lite.runtime.checkpoint import deepspeed as _deepspeed_checkpoint
from fabric_lite.strategies import _deepspeed_config
from fabric_lite.strategies.deepspeed import DeepSpeedStrategy
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.utilities.imports import DEEPSPEED_INSTALL, import_deepspeed
from tests.helpers.harness import REPO, Completed, base_env, optional_venv, per_rank, run_job, run_python

DEEPSPEED_NAMES = [name for name in STRATEGY_REGISTRY if name.startswith("deepspeed")]
#: Lightning Fabric 2.6.6's registrations (lightning_fabric/strategies/deepspeed.py), name -> keyword arguments
LIGHTNING_REGISTRY = {
    "deepspeed": {},
    "deepspeed_stage_1": {"stage": 1},
    "deepspeed_stage_1_offload": {"stage": 1, "offload_optimizer": True},
    "deepspeed_stage_2": {"stage": 2},
    "deepspeed_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "deepspeed_stage_3": {"stage": 3},
    "deepspeed_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    "deepspeed_stage_3_offload_nvme": {
        "stage": 3,
        "offload_optimizer": True,
        "offload_parameters": True,
        "remote_device": "nvme",
        "offload_params_device": "nvme",
        "offload_optimizer_device": "nvme",
    },
}


def plan(**kwargs: Any) -> Any:
    kwargs.setdefault("env", {})
    kwargs.setdefault("machine", Machine())
    return resolve_plan(**kwargs)


@pytest.fixture
def no_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import deepspeed`` fails here, even where DeepSpeed is installed (``None`` in ``sys.modules``)."""
    monkeypatch.setitem(sys.modules, "deepspeed", None)


# ------------------------------------------------------------------------------------ no DeepSpeed needed
def test_registry_has_lightnings_names_and_arguments() -> None:
    assert sorted(DEEPSPEED_NAMES) == sorted(LIGHTNING_REGISTRY)
    for name, kwargs in LIGHTNING_REGISTRY.items():
        entry = STRATEGY_REGISTRY[name]
        assert (entry.class_name, entry.parallel, entry.start_method, entry.init_kwargs) == (
            "DeepSpeedStrategy",
            True,
            "popen",
            kwargs,
        ), name


@pytest.mark.parametrize("name", DEEPSPEED_NAMES)
def test_plan_of_every_name(name: str) -> None:
    result = plan(strategy=name, devices=2, accelerator="cpu")
    assert (result.strategy, result.parallel, result.start_method, result.world_size) == (name, True, "popen", 2)
    assert result.backend == "gloo" and result.precision == "32-true"


def test_plan_under_torchrun_starts_nothing() -> None:
    env = {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    result = plan(strategy="deepspeed_stage_3", env=env)
    assert (result.start_method, result.devices, result.world_size) == (None, (0, 1), 2)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "bf16"])
def test_plan_accepts_deepspeeds_cpu_precisions(precision: str) -> None:
    assert plan(strategy="deepspeed", precision=precision).precision in ("32-true", "bf16-mixed", "bf16-true")


@pytest.mark.parametrize("precision", ["16-mixed", "16-true", 16])
def test_plan_refuses_float16_on_the_cpu(precision: Any) -> None:
    with pytest.raises(ValueError) as excinfo:
        plan(strategy="deepspeed_stage_2", precision=precision)
    message = str(excinfo.value)
    assert "DeepSpeed's CPU accelerator" in message and "Type fp16 is not supported on your device" in message
    assert "precision='bf16-mixed'" in message and "accelerator='cuda'" in message


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_plan_keeps_float16_on_cuda(precision: str) -> None:
    result = plan(strategy="deepspeed", precision=precision, accelerator="cuda", machine=Machine(cuda_devices=2))
    assert (result.precision, result.backend, result.devices) == (precision, "nccl", (0, 1))


def test_plan_refuses_double_and_mps() -> None:
    with pytest.raises(ValueError, match=r"precision='64-true' is not supported with strategy='deepspeed'.*'32-true'"):
        plan(strategy="deepspeed", precision="64-true")
    with pytest.raises(ValueError, match=r"strategy='deepspeed_stage_3' runs on CUDA GPUs or on the CPU, not.*mps"):
        plan(strategy="deepspeed_stage_3", accelerator="mps", machine=Machine(mps_available=True))


def test_cli_accepts_the_names() -> None:
    from fabric_lite.cli import CLI_STRATEGIES

    assert set(DEEPSPEED_NAMES) <= set(CLI_STRATEGIES)


def test_missing_deepspeed_gives_the_install_command(no_deepspeed: None) -> None:
    with pytest.raises(ModuleNotFoundError) as excinfo:
        Fabric(accelerator="cpu", devices=2, strategy="deepspeed_stage_2")
    message = str(excinfo.value)
    assert DEEPSPEED_INSTALL == "pip install 'fabric-lite[deepspeed]'" and DEEPSPEED_INSTALL in message
    assert "strategy='deepspeed' needs DeepSpeed" in message and sys.executable in message
    assert ".ci/setup-deepspeed" in message and "DeepSpeed (optional)" in message


def test_missing_deepspeed_with_this_projects_venv(tmp_path: Path) -> None:
    """The interpreter of the normal suite (no DeepSpeed in .venv): the real import fails, with the command."""
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip(f"{sys.executable} has DeepSpeed installed")
    script = tmp_path / "train.py"
    script.write_text("from fabric_lite import Fabric\nFabric(accelerator='cpu', devices=2, strategy='deepspeed')\n")
    done = run_python([str(script)], timeout=90, env=base_env())
    assert done.returncode != 0
    assert "ModuleNotFoundError: strategy='deepspeed' needs DeepSpeed" in done.stderr, done.output
    assert "pip install 'fabric-lite[deepspeed]'" in done.stderr


def test_unsupported_torch_and_deepspeed_pair_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.15.4" if name == "deepspeed" else real(name))
    with pytest.raises(ImportError) as excinfo:
        import_deepspeed()
    message = str(excinfo.value)
    assert "DeepSpeed 0.15.4" in message and f"torch {torch.__version__}" in message and "0.16.0" in message


def test_deepspeed_that_breaks_on_import_names_both_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.metadata

    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "__init__.py").write_text("import torch\ntorch._no_such_attribute_in_this_torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.99.0" if name == "deepspeed" else real(name))
    with pytest.raises(ImportError) as excinfo:
        import_deepspeed()
    message = str(excinfo.value)
    assert "DeepSpeed 0.99.0 cannot be imported with torch" in message and torch.__version__ in message
    assert "AttributeError" in message and not isinstance(excinfo.value, ModuleNotFoundError)
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        pytest.param({"stage": 4}, ValueError, "stage=4): the ZeRO stage must be one of (0, 1, 2, 3)", id="stage"),
        pytest.param({"stage": "2"}, ValueError, "stage='2')", id="stage-str"),
        pytest.param({"offload_optimizer_device": "gpu"}, ValueError, "offload_optimizer_device='gpu')", id="dev"),
        pytest.param({"offload_params_device": None}, ValueError, "offload_params_device=None)", id="params-dev"),
        pytest.param({"remote_device": "cuda"}, ValueError, "remote_device='cuda')", id="remote"),
        pytest.param({"logging_batch_size_per_gpu": 0}, ValueError, "logging_batch_size_per_gpu=0)", id="batch"),
        pytest.param({"config": 3}, TypeError, "config=3): pass a dict, the path of a JSON file", id="config"),
        pytest.param({"config": "/no/such/ds.json"}, FileNotFoundError, "/no/such/ds.json", id="missing-file"),
        pytest.param({"precision": DoublePrecision()}, TypeError, "DoublePrecision(precision='64-true')", id="prec"),
        pytest.param({"timeout": 30}, TypeError, "timeout must be a datetime.timedelta", id="timeout"),
    ],
)
def test_constructor_checks_before_importing_deepspeed(
    no_deepspeed: None, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as excinfo:
        DeepSpeedStrategy(**kwargs)
    assert fragment in str(excinfo.value)


def test_config_file_errors(no_deepspeed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        DeepSpeedStrategy(config=bad)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list; it must be a JSON object"):
        DeepSpeedStrategy(config=str(listing))
    # Lightning's variable names the file when no config is passed
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(tmp_path / "absent.json"))
    with pytest.raises(FileNotFoundError, match=r"absent\.json"):
        DeepSpeedStrategy()
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(good))
    with pytest.raises(ModuleNotFoundError):  # the config was read: only the import is left to fail
        DeepSpeedStrategy()


def test_config_from_arguments_is_lightnings_without_clipping() -> None:
    config = _deepspeed_config.default_config(**_arguments(stage=3, offload_optimizer=True, offload_parameters=True))
    assert config["gradient_clipping"] == 0.0  # DeepSpeed 0.19 would clip at 1.0 when the key is missing
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] is True and zero["reduce_bucket_size"] == 200_000_000
    assert zero["offload_optimizer"] == {
        "device": "cpu",
        "nvme_path": "/local_nvme",
        "buffer_count": 4,
        "pin_memory": False,
    }
    assert zero["offload_param"]["max_in_cpu"] == 1_000_000_000 and config["zero_allow_untested_optimizer"] is True
    assert config["aio"]["block_size"] == 1048576 and "train_micro_batch_size_per_gpu" not in config
    without = _deepspeed_config.default_config(**_arguments(zero_optimization=False, logging_batch_size_per_gpu=8))
    assert "zero_optimization" not in without and without["train_micro_batch_size_per_gpu"] == 8
    assert _deepspeed_config.zero_stage(without) == 0 and _deepspeed_config.zero_stage(config) == 3


def _arguments(**overrides: Any) -> dict[str, Any]:
    """``default_config``'s arguments with DeepSpeedStrategy's defaults."""
    import inspect

    parameters = inspect.signature(DeepSpeedStrategy.__init__).parameters
    own = (
        "self",
        "accelerator",
        "config",
        "logging_level",
        "parallel_devices",
        "cluster_environment",
        "loss_scale",
        "initial_scale_power",
        "loss_scale_window",
        "hysteresis",
        "min_loss_scale",
        "load_full_weights",
        "precision",
        "process_group_backend",
        "timeout",
        "exclude_frozen_parameters",
        "remote_device",
    )
    arguments = {name: p.default for name, p in parameters.items() if name not in own}
    arguments.update(overrides)
    return arguments


def test_precision_goes_into_the_config() -> None:
    scale = {
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "min_loss_scale": 1,
        "initial_scale_power": 16,
        "hysteresis": 2,
    }
    bf16: dict[str, Any] = {}
    _deepspeed_config.format_config(bf16, "bf16-mixed", **scale)
    assert bf16 == {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
    fp16: dict[str, Any] = {"train_batch_size": 32}
    _deepspeed_config.format_config(fp16, "16-mixed", **scale)
    assert fp16["fp16"]["enabled"] is True and fp16["fp16"]["initial_scale_power"] == 16
    assert "train_micro_batch_size_per_gpu" not in fp16  # DeepSpeed derives it from train_batch_size
    full: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4}
    _deepspeed_config.format_config(full, "32-true", **scale)
    assert full == {"train_micro_batch_size_per_gpu": 4}
    kept = {"bf16": {"enabled": True, "immediate_grad_update": True}}
    _deepspeed_config.format_config(kept, "bf16-true", **scale)
    assert kept["bf16"] == {"enabled": True, "immediate_grad_update": True}
    with pytest.raises(ValueError, match=r"enables 'bf16', but Fabric\(precision='32-true'\).*precision='bf16-mixed'"):
        _deepspeed_config.format_config({"bf16": {"enabled": True}}, "32-true", **scale)
    with pytest.raises(ValueError, match=r"needs DeepSpeed's 'fp16' section enabled"):
        _deepspeed_config.format_config({"fp16": {"enabled": False}}, "16-mixed", **scale)


def test_precision_plugin() -> None:
    with pytest.raises(ValueError, match=r"`precision='64-true'` is not supported in DeepSpeed.*'32-true'"):
        DeepSpeedPrecision("64-true")  # type: ignore[arg-type]
    mixed = DeepSpeedPrecision("bf16-mixed")
    module = torch.nn.Linear(2, 2)
    assert mixed.convert_module(module).weight.dtype == torch.float32  # the engine casts it
    assert mixed.convert_input({"x": torch.ones(2), "ids": torch.arange(2)})["x"].dtype == torch.bfloat16
    assert mixed.convert_output(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    true = DeepSpeedPrecision("bf16-true")
    assert true.convert_module(torch.nn.Linear(2, 2)).weight.dtype == torch.bfloat16
    with true.module_init_context():
        assert torch.nn.Linear(2, 2).weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32

    class Engine:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def backward(self, loss: Any) -> None:
            self.seen.append(loss)

    loss, engine = torch.tensor(1.0), Engine()
    mixed.backward(loss, engine)  # type: ignore[arg-type]
    assert engine.seen == [loss]
    with pytest.raises(TypeError, match="needs the DeepSpeed engine, got NoneType"):
        mixed.backward(loss, None)


def test_fabrics_precision_plugins_become_deepspeeds() -> None:
    from fabric_lite.plugins.precision import Precision
    from fabric_lite.strategies._deepspeed_runtime import deepspeed_precision as _deepspeed_precision

    assert _deepspeed_precision(Precision()).precision == "32-true"  # type: ignore[union-attr]
    assert _deepspeed_precision(MixedPrecision("bf16-mixed", "cpu")).precision == "bf16-mixed"  # type: ignore[union-attr]
    assert _deepspeed_precision(HalfPrecision("bf16-true")).precision == "bf16-true"  # type: ignore[union-attr]
    plugin = DeepSpeedPrecision("bf16-mixed")
    assert _deepspeed_precision(plugin) is plugin and _deepspeed_precision(None) is None


def test_checkpoint_folder_recognition(tmp_path: Path) -> None:
    folder = tmp_path / "step-1"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")
    (folder / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert _deepspeed_checkpoint.is_deepspeed_checkpoint(folder)
    assert not _deepspeed_checkpoint.is_deepspeed_checkpoint(tmp_path)
    assert not _deepspeed_checkpoint.is_deepspeed_checkpoint("s3://bucket/step-1")
    assert _deepspeed_checkpoint.check_folder(folder) == folder
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"Try to load using this parent directory instead: {folder}")
    ):
        _deepspeed_checkpoint.check_folder(folder / "checkpoint")
    with pytest.raises(FileNotFoundError, match="file inside a DeepSpeed checkpoint folder"):
        _deepspeed_checkpoint.check_folder(folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(FileNotFoundError, match="not a valid DeepSpeed checkpoint"):
        _deepspeed_checkpoint.check_folder(tmp_path / "nothing")


def test_user_entries_from_the_index_or_lightnings_folder() -> None:
    client = {"step": 3, "fabric_lite:lr_scheduler": {"a": 1}, "ds_version": "0.19.8", "global_steps": 3}
    index = {"entries": {"step": "step", "lr_scheduler": "fabric_lite:lr_scheduler"}}
    assert _deepspeed_checkpoint._user_entries(index, client) == {
        "step": "step",
        "lr_scheduler": "fabric_lite:lr_scheduler",
    }
    # a folder Lightning wrote: every entry DeepSpeed did not write itself
    lightning = {"step": 3, "epoch": 1, "ds_version": "0.19.8", "global_steps": 3, "param_shapes": []}
    assert _deepspeed_checkpoint._user_entries(None, lightning) == {"step": "step", "epoch": "epoch"}


def test_consolidation_command_without_deepspeed(tmp_path: Path, no_deepspeed: None, capsys: Any) -> None:
    from fabric_lite.utilities.consolidate import main

    folder = tmp_path / "step-1"
    (folder / "checkpoint").mkdir(parents=True)
    assert main([str(folder), str(tmp_path / "out.pt")]) == 1
    error = capsys.readouterr().err
    assert "needs DeepSpeed" in error and "pip install 'fabric-lite[deepspeed]'" in error
    assert not (tmp_path / "out.pt").exists()


def test_readme_and_package_metadata() -> None:
    readme = (REPO / "README.md").read_text()
    assert "## DeepSpeed (optional)" in readme or "### DeepSpeed (optional)" in readme
    for fragment in (
        ".ci/setup-deepspeed",
        "FABRIC_LITE_DEEPSPEED=1",
        "TORCH_EXTENSIONS_DIR",
        "DS_BUILD_OPS=0",
        "zero_force_ds_cpu_optimizer",
        "torch_adam",
    ):
        assert fragment in readme, fragment
    text = (REPO / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "deepspeed" not in dependencies.lower()
    assert 'deepspeed = ["deepspeed>=0.16"]' in text
    assert '"deepspeed: ' in text  # the marker is registered
    assert os.access(REPO / ".ci" / "setup-deepspeed", os.X_OK)


# ------------------------------------------------------------------------------------ the deepspeed tier
JOB_TIMEOUT = 420  # seconds per job: about 40 s on a quiet 2-core machine; generous for a busy one
VENV = REPO / ".venv-deepspeed"
PROBE = "import deepspeed, fabric_lite, pytest, hypothesis"


@pytest.fixture(scope="module")
def ds_python(request: pytest.FixtureRequest) -> str:
    """The Python of ``.venv-deepspeed``, built by ``.ci/setup-deepspeed`` when missing."""
    return optional_venv(
        request.config,
        marker="deepspeed",
        variable="FABRIC_LITE_DEEPSPEED",
        module_file="test_deepspeed.py",
        venv=VENV,
        setup=".ci/setup-deepspeed",
        probe=PROBE,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deepspeed")


def _job(python: str, job: str, nprocs: int, torchrun: bool = False, **spec: Any) -> list[Any]:
    """``job`` of tests/helpers/jobs/deepspeed_jobs.py on ``nprocs`` CPU ranks: started by ``fabric.launch()`` (the
    script re-run), or by ``torch.distributed.run``; every rank's result."""
    arguments = ["-m", "tests.helpers.jobs.deepspeed_jobs", job, str(nprocs), json.dumps(spec)]
    if torchrun:
        arguments = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nprocs), *arguments]
    return run_job(arguments, JOB_TIMEOUT, env=base_env(), python=python)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def trained(ds_python: str, folder: Path) -> list[dict[str, Any]]:
    return _job(ds_python, "training", 2, strategy="deepspeed_stage_1")


@pytest.fixture(scope="module")
def checkpointed(ds_python: str, folder: Path) -> list[dict[str, Any]]:
    return _job(
        ds_python,
        "checkpoints",
        2,
        torchrun=True,
        strategy="deepspeed_stage_2",
        kwargs={"folder": str(folder)},
    )


def _close(a: list[float], b: list[float], tolerance: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance * max(1.0, abs(y)) for x, y in zip(a, b))


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_launch_ranks_and_collectives(trained: list[dict[str, Any]]) -> None:
    for rank, seen in enumerate(per_rank(trained, "launched")):
        assert seen["ranks"] == [rank, rank, 2] and seen["device"] == "cpu"
        assert (seen["strategy"], seen["stage"], seen["precision"]) == ("DeepSpeedStrategy", 1, "DeepSpeedPrecision")
        assert seen["launcher"] == "SubprocessScriptLauncher"  # strategy="deepspeed_stage_1": the script re-run
        assert seen["sampler"] == {"num_replicas": 2, "rank": rank}
        assert seen["env"] == [str(rank), str(rank), "2"]  # what DeepSpeed reads, as torchrun would set it
    for seen in per_rank(trained, "collectives"):
        assert seen == {"mean": 1.5, "gather": [[0], [1]], "broadcast": {"from": 1}, "any": True}


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_stages_1_2_3_train_as_ddp(trained: list[dict[str, Any]]) -> None:
    for rank, runs in enumerate(per_rank(trained, "parity")):
        ddp = runs["ddp"]
        assert len(ddp["losses"]) == 10
        for name in ("deepspeed_stage_0", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"):
            assert _close(runs[name]["losses"], ddp["losses"]), (rank, name, runs[name]["losses"], ddp["losses"])
            assert _close(runs[name]["params"], ddp["params"]), (rank, name)
            assert runs[name]["engine_world_size"] == 2  # the engine sees both processes
        assert runs["deepspeed_stage_1"]["optimizer"] == "DeepSpeedZeroOptimizer"
        assert runs["deepspeed_stage_3"]["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_stage_3_partitions_parameters_at_construction(trained: list[dict[str, Any]]) -> None:
    ddp_losses = per_rank(trained, "parity")
    for rank, seen in enumerate(per_rank(trained, "stage3_partitioned")):
        # under init_module(empty_init=True) every parameter is created partitioned: empty here, whole size known
        assert seen["created"] == [[0, 128], [0, 16], [0, 16], [0, 1]]
        assert seen["local"] == [64, 8, 8, 1]  # this rank's partition of each
        assert _close(seen["losses"], ddp_losses[rank]["ddp"]["losses"])


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_bf16(trained: list[dict[str, Any]]) -> None:
    parity = per_rank(trained, "parity")
    for rank, runs in enumerate(per_rank(trained, "bf16")):
        for name, seen in runs.items():
            assert seen["param_dtype"] == "torch.bfloat16" and seen["config_bf16"] == {"enabled": True}, name
            assert seen["output_dtype"] == "torch.float32", name  # outputs back in the default dtype
            assert _close(seen["losses"], parity[rank]["ddp"]["losses"], tolerance=2e-2), (name, seen["losses"])
        # float32 master weights: stage 2 in bf16-mixed and stage 3 in bf16-true compute the same steps
        stage2, stage3 = runs["deepspeed_stage_2/bf16-mixed"], runs["deepspeed_stage_3/bf16-true"]
        assert _close(stage2["losses"], stage3["losses"], tolerance=1e-3)


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_gradient_accumulation(trained: list[dict[str, Any]]) -> None:
    for runs in per_rank(trained, "accumulation"):
        ddp = runs["ddp"]
        for name in ("deepspeed_stage_2", "deepspeed_stage_3", "config_gas"):
            assert _close(runs[name]["losses"], ddp["losses"]), name
            assert _close(runs[name]["params"], ddp["params"], tolerance=1e-4), name


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_misuse_raises_clearly(trained: list[dict[str, Any]]) -> None:
    expected = {
        "setup_optimizers": ("NotImplementedError", "set up jointly through `.setup(model, optimizer, ...)`"),
        "two_optimizers": ("ValueError", "only one optimizer is supported with DeepSpeed. Got 2 optimizers"),
        "clip_norm": ("NotImplementedError", '"gradient_clipping": 1.0'),
        "clip_value": ("NotImplementedError", "clip_gradients(clip_val=0.5)"),
        "backward_twice": ("RuntimeError", "with ZeRO stage 2 DeepSpeed keeps only the gradients of the last"),
        "step_inside_no_sync": ("RuntimeError", "optimizer.step() was called inside fabric.no_backward_sync"),
        "setup_module_stage2": ("RuntimeError", "ZeRO stage 2 partitions an optimizer's state"),
        "load_without_state": ("ValueError", "a state with at least a model instance to reload is required"),
        "save_filter": ("TypeError", "`DeepSpeedStrategy.save_checkpoint(..., filter=...)` is not supported"),
        "save_without_model": ("ValueError", "Could not find a DeepSpeed model in the provided checkpoint state"),
        "empty_init_false": ("NotImplementedError", "`empty_init=False` is not a valid choice"),
        "backward_without_optimizer": ("RuntimeError", "set up without an optimizer (fabric.setup_module)"),
        "backward_ambiguous": ("ValueError", "`fabric.backward(loss, model=model)`"),
    }
    for rank, seen in enumerate(per_rank(trained, "misuse")):
        assert seen["setup_optimizers"]["runtime_error"]  # Lightning's Fabric raises RuntimeError there
        assert seen["inference_forward"] == [2, 1]  # setup_module under stage 3: an engine for inference
        for name, (kind, fragment) in expected.items():
            assert seen[name]["type"] == kind, (rank, name, seen[name])
            assert fragment in seen[name]["message"], (rank, name, seen[name]["message"])


@pytest.mark.deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["stage2", "stage3_bf16", "stage0"])
def test_save_load_round_trip_with_user_state(checkpointed: list[dict[str, Any]], name: str) -> None:
    for rank, seen in enumerate(per_rank(checkpointed, name)):
        assert seen["saved_vs_loaded"] == 0.0, rank
        assert seen["resumed"] == seen["continued"], rank  # the loaded model and optimizer go on exactly as saved
        # a plain value, a name DeepSpeed uses itself, a stateful object; the entry not asked for comes back
        assert seen["entries"] == [3, {"base": 0.5}, 7] and seen["remainder"] == {"note": "kept"}, rank
        zero_scripts = [] if name == "stage0" else ["zero_to_fp32.py", "zero_to_torch.py"]  # ZeRO's own converters
        assert seen["listing"] == ["checkpoint", "fabric_lite.json", "latest", *zero_scripts]


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_strict_and_remainder(checkpointed: list[dict[str, Any]]) -> None:
    for seen in per_rank(checkpointed, "strictness"):
        assert seen["strict"]["type"] == "KeyError"
        assert "contains a key 'absent' that does not exist" in seen["strict"]["message"]
        assert "strict=False" in seen["strict"]["message"]
        assert seen["lenient_state"] == 1 and seen["lenient_remainder"] == ["counter", "lr_scheduler", "note", "step"]
        assert seen["model_only_remainder"] == ["counter", "lr_scheduler", "note", "step"]


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_atomic_replace_and_refusal(checkpointed: list[dict[str, Any]]) -> None:
    for seen in per_rank(checkpointed, "replace_and_refuse"):
        assert seen["step"] == 2  # the second save replaced the first
        assert (
            seen["refused"]["type"] == "CheckpointError" and "not a DeepSpeed checkpoint" in seen["refused"]["message"]
        )
        assert seen["kept"] == "mine" and seen["leftovers"] == []  # no temporary or old folder left beside them
        assert seen["inside"]["type"] == "FileNotFoundError" and "parent directory" in seen["inside"]["message"]


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_offload_trains_as_ddp(checkpointed: list[dict[str, Any]]) -> None:
    for runs in per_rank(checkpointed, "offload"):
        for name in ("stage2_offload", "stage3_offload"):
            assert _close(runs[name]["losses"], runs["ddp"]["losses"]), name
            assert _close(runs[name]["params"], runs["ddp"]["params"]), name


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_consolidation_and_single_file_into_stage_3(checkpointed: list[dict[str, Any]]) -> None:
    ranks = per_rank(checkpointed, "consolidation")
    assert "rank0_traceback" not in ranks[0], ranks[0].get("rank0_traceback")
    assert ranks[0]["keys"] == ["counter", "lr_scheduler", "model", "note", "step"] and ranks[0]["vs_saved"] == 0.0
    assert ranks[0]["entries"] == [3, {"base": 0.5}, {"value": 7}, "kept"]
    for seen in ranks:
        assert seen["into_stage3"] == 0.0  # gathered, loaded, re-partitioned
        assert seen["into_stage3_entries"] == [3, 7, ["lr_scheduler", "note"]]
        assert len(seen["into_stage3_trains"]) == 2
        assert seen["optimizer_from_file"]["type"] == "ValueError"


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_consolidation_command(ds_python: str, checkpointed: list[dict[str, Any]], folder: Path) -> None:
    out = folder / "stage3.consolidated.pt"
    done = run_python(
        ["-m", "fabric_lite.utilities.consolidate", str(folder / "stage3"), str(out)],
        timeout=180,
        env=base_env(),
        python=ds_python,
    )
    assert done.returncode == 0 and f"wrote {out}" in done.stdout, done.output
    whole = torch.load(out, weights_only=True)
    assert sorted(whole) == ["counter", "lr_scheduler", "model", "note", "step"]
    assert all(v.dtype == torch.float32 for v in whole["model"].values())
    flat = torch.cat([v.flatten() for v in whole["model"].values()]).tolist()
    saved = per_rank(checkpointed, "stage3_bf16")[0]["saved_params"]  # the model's bfloat16 weights
    assert _close(flat, saved, tolerance=1e-2)
    # without ZeRO (stage 0) the module is whole in the model states
    out0 = folder / "stage0.pt"
    done = run_python(
        ["-m", "fabric_lite.utilities.consolidate", str(folder / "stage0"), str(out0)],
        timeout=180,
        env=base_env(),
        python=ds_python,
    )
    assert done.returncode == 0, done.output
    whole = torch.load(out0, weights_only=True)
    flat = torch.cat([v.flatten() for v in whole["model"].values()]).tolist()
    assert flat == per_rank(checkpointed, "stage0")[0]["saved_params"] and whole["step"] == 3


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_load_into_another_world_size(ds_python: str, checkpointed: list[dict[str, Any]], folder: Path) -> None:
    (seen,) = _job(
        ds_python,
        "other_world_size",
        1,
        strategy="deepspeed_stage_2",
        kwargs={"folder": str(folder)},
    )
    weights = seen["weights"]
    assert "traceback" not in weights, weights.get("traceback")
    assert weights["world_size"] == 1
    assert weights["params"] == per_rank(checkpointed, "stage2")[0]["saved_params"]
    assert weights["entries"] == [3, 7, {"base": 0.5}] and weights["remainder"] == {"note": "kept"}
    error = seen["with_optimizer"]
    assert error["type"] == "CheckpointError" and "saved by 2 ranks and is loaded by 1" in error["message"]
    assert "Leave the optimizer out of the state" in error["message"]


@pytest.mark.deepspeed
@pytest.mark.distributed
def test_a_lightning_script_with_only_the_import_changed(ds_python: str, tmp_path: Path) -> None:
    source = (REPO / "tests" / "helpers" / "scripts" / "deepspeed_lightning_style.py").read_text()
    lines = source.splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line == "from lightning.fabric import Fabric\n"]
    lines[index] = "from fabric_lite import Fabric\n"  # the only change
    script = tmp_path / "train.py"
    script.write_text("".join(lines))
    flags = ["--accelerator", "cpu", "--devices", "2", "--strategy", "deepspeed_stage_2", "--precision", "bf16-mixed"]
    done = run_python(
        ["-m", "fabric_lite", "run", *flags, str(script), str(tmp_path)],
        timeout=JOB_TIMEOUT,
        env=base_env(),
        python=ds_python,
    )
    assert done.returncode == 0, done.output
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.split(" ", 1)[1])
    assert result["world_size"] == 2 and result["strategy"] == "DeepSpeedStrategy" and result["epoch"] == 3
    assert result["losses"][-1] < result["losses"][0] and result["accuracy"] > 0.5, result
    assert (tmp_path / "checkpoint" / "checkpoint").is_dir()


@pytest.mark.deepspeed
def test_importing_fabric_lite_does_not_import_deepspeed(ds_python: str) -> None:
    probe = (
        "import sys, fabric_lite, fabric_lite.strategies, fabric_lite.plugins\n"
        "from fabric_lite.strategies import DeepSpeedStrategy\n"
        "from fabric_lite.utilities import consolidate\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deepspeed'))"
    )
    done: Completed = run_python(["-c", probe], python=ds_python, timeout=90, env=base_env())
    assert done.returncode == 0, done.output
    assert done.stdout.strip() == "[]"
