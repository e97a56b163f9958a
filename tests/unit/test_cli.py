"""`fabric-lite run` without starting a process: the parser, flag validation (every bad flag fails before anything
starts), the torchrun command line, and the table of CLI settings against `Fabric(...)` arguments in `resolve_plan`.

The real launches through torch's elastic agent are in tests/distributed/test_cli.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from fabric_lite._plan import Machine, resolve_plan
from fabric_lite.accelerators import CPUAccelerator, CUDAAccelerator
from fabric_lite.cli import (
    CLI_STRATEGIES,
    _consolidate,
    _get_supported_strategies,
    _main,
    _run,
    build_parser,
    launch_command,
    main,
)
from fabric_lite.strategies import DDPStrategy
from tests.helpers.harness import REPO

SCRIPT = "tests/helpers/scripts/cli_train.py"  # launches run in the repository (tests/helpers/harness.py)


ABS_SCRIPT = str(REPO / SCRIPT)  # the unit tests run wherever pytest runs


# ---------------------------------------------------------------------------------------------------- unit tier
def command(*argv: str, machine: Machine | None = None) -> list[str]:
    args = build_parser().parse_args(["run", *argv])
    return launch_command(args, machine or Machine()).torchrun_args


def test_help_documents_every_flag_with_an_example(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal width; unwrapped lines are easier to match
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    flags = ["--accelerator", "--strategy", "--devices", "--num-nodes", "--node-rank", "--main-address"]
    flags += ["--main-port", "--precision", "--max-restarts"]
    for flag in flags:
        assert f"(e.g. {flag} " in text, flag
    assert "SCRIPT_ARGS" in text and "examples:" in text
    assert "fabric-lite run --accelerator cpu --devices 2 train.py" in text
    assert "--num-nodes 2 --node-rank 0 --main-address" in text
    assert "GLOO_SOCKET_IFNAME" in text


def test_no_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "fabric-lite run --help" in capsys.readouterr().err


def test_one_node_uses_a_port_torchrun_binds_itself() -> None:
    assert command("--accelerator", "cpu", "--devices", "2", ABS_SCRIPT, "--lr", "0.1") == [
        "--nproc-per-node", "2", "--max-restarts", "0", "--standalone",
        "--module", "fabric_lite._run_script", ABS_SCRIPT, "--lr", "0.1",
    ]  # fmt: skip


# Lightning's `fabric run` (click, interspersed options) takes its flags before or after SCRIPT, in both spellings;
# every other argument after SCRIPT, and all after `--`, is the script's. (argv, the settings, the script's arguments)
LIGHTNING_ORDER = [
    (["--devices", "2", "S", "--lr", "0.1"], {"devices": "2"}, ["--lr", "0.1"]),
    (["S", "--accelerator=cpu", "--devices=2", "--strategy=ddp", "--lr=0.1", "-x"],
     {"accelerator": "cpu", "devices": "2", "strategy": "ddp"}, ["--lr=0.1", "-x"]),
    (["--devices", "2", "S", "--devices", "3", "--epochs", "4"], {"devices": "3"}, ["--epochs", "4"]),
    (["S", "--", "--devices", "3"], {"devices": "1"}, ["--devices", "3"]),
    (["--num_nodes", "2", "--node_rank=1", "--main_address", "10.0.0.1", "--main_port", "1234", "S", "a"],
     {"num_nodes": 2, "node_rank": 1, "main_address": "10.0.0.1", "main_port": 1234}, ["a"]),
    (["S", "--num-nodes=3", "--node-rank", "2", "--precision", "bf16-mixed", "b", "--c"],
     {"num_nodes": 3, "node_rank": 2, "precision": "bf16-mixed"}, ["b", "--c"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "settings", "script_args"), LIGHTNING_ORDER)
def test_flags_before_or_after_the_script_as_lightning_parses_them(
    argv: list[str], settings: dict[str, Any], script_args: list[str]
) -> None:
    args = build_parser().parse_args(["run", *[ABS_SCRIPT if a == "S" else a for a in argv]])
    assert {name: getattr(args, name) for name in settings} == settings
    assert (args.script, args.script_args) == (ABS_SCRIPT, script_args)


def test_unknown_flag_before_the_script_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--lr", "0.1", ABS_SCRIPT])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --lr" in capsys.readouterr().err


def test_a_module_runs_like_python_m_and_takes_every_argument_after_it() -> None:
    """``-m MODULE``: every argument after MODULE is the module's (its own --devices included), as with python -m."""
    args = build_parser().parse_args(["run", "--devices", "2", "--as-lightning", "-m", "json.tool", "in", "--devices"])
    assert (args.module, args.script, args.script_args, args.devices, args.as_lightning) == (
        "json.tool",
        None,
        ["in", "--devices"],
        "2",
        True,
    )
    launch = launch_command(args, Machine())
    assert launch.torchrun_args[-6:] == ["--module", "fabric_lite._run_script", "-m", "json.tool", "in", "--devices"]
    assert launch.env["FABRIC_LITE_AS_LIGHTNING"] == "1"  # each worker turns the import hook on at start-up
    plain = launch_command(build_parser().parse_args(["run", ABS_SCRIPT]), Machine())
    assert "FABRIC_LITE_AS_LIGHTNING" not in plain.env


def test_a_module_that_cannot_be_imported_fails_before_anything_starts(
    capsys: pytest.CaptureFixture[str], no_launch: None
) -> None:
    assert main(["run", "--devices", "2", "-m", "no_such_module_here.sub", "x"]) == 2
    err = capsys.readouterr().err
    assert "-m 'no_such_module_here.sub': no module 'no_such_module_here' can be imported" in err, err


def test_multi_node_command() -> None:
    argv = ["--accelerator", "cpu", "--devices", "2", "--num-nodes", "2", "--node-rank", "1"]
    argv += ["--main-address", "10.1.2.3", "--main-port", "1234", "--max-restarts", "2", ABS_SCRIPT]
    assert command(*argv) == [
        "--nproc-per-node", "2", "--max-restarts", "2", "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "10.1.2.3", "--master-port", "1234", "--module", "fabric_lite._run_script", ABS_SCRIPT,
    ]  # fmt: skip
    # without --main-port, every node uses torchrun's default port
    assert "29500" in command(*[a for a in argv if a not in ("--main-port", "1234")])


def test_settings_reach_fabric_through_the_environment() -> None:
    args = build_parser().parse_args(
        ["run", "--accelerator", "cpu", "--devices", "3", "--precision", "bf16", ABS_SCRIPT]
    )
    launch = launch_command(args, Machine())
    assert launch.nproc_per_node == 3
    assert launch.env == {
        "LT_CLI_USED": "1",  # Lightning's mark: Fabric() in the script joins the other processes at once
        "LT_ACCELERATOR": "cpu",
        "LT_DEVICES": "3",
        "LT_NUM_NODES": "1",
        "LT_PRECISION": "bf16",
    }


@pytest.mark.parametrize(
    ("argv", "machine", "nproc"),
    [
        (["--accelerator", "cpu", "--devices", "4"], Machine(), 4),
        (["--devices", "1"], Machine(), 1),
        (["--accelerator", "cuda", "--devices", "-1"], Machine(cuda_devices=4), 4),
        (["--accelerator", "gpu", "--devices", "0,2"], Machine(cuda_devices=4), 2),
        (["--accelerator", "cuda", "--devices", "auto"], Machine(cuda_devices=3), 3),
        (["--accelerator", "cpu", "--devices", "auto"], Machine(), 1),
    ],
)
def test_processes_per_node(argv: list[str], machine: Machine, nproc: int) -> None:
    assert command(*argv, ABS_SCRIPT, machine=machine)[:2] == ["--nproc-per-node", str(nproc)]


def test_strategies_that_start_their_own_processes_or_need_xla_are_not_offered() -> None:
    assert {"auto", "ddp", "single_device", "ddp_find_unused_parameters_false"} <= set(CLI_STRATEGIES)
    assert not {"ddp_spawn", "ddp_fork", "ddp_notebook", "horovod"} & set(CLI_STRATEGIES)
    assert not {"xla", "xla_fsdp", "single_xla", "single_tpu"} & set(CLI_STRATEGIES)
    # the offloading names say everything the strategy needs: torchrun starts them like the others
    assert {"fsdp_cpu_offload", "deepspeed_stage_2_offload", "deepspeed_stage_3_offload_nvme"} <= set(CLI_STRATEGIES)
    # Lightning's list (its name, its 8 names): the listed registry names but the offloading ones
    assert _get_supported_strategies() == [
        "ddp",
        "ddp_find_unused_parameters_true",
        "dp",
        "fsdp",
        "deepspeed",
        "deepspeed_stage_1",
        "deepspeed_stage_2",
        "deepspeed_stage_3",
    ]
    assert set(_get_supported_strategies()) < set(CLI_STRATEGIES)


def test_an_offloading_strategy_is_run() -> None:
    args = build_parser().parse_args(["run", "--strategy", "deepspeed_stage_2_offload", ABS_SCRIPT])
    assert args.strategy == "deepspeed_stage_2_offload"
    argv = command("--accelerator", "cpu", "--devices", "2", "--strategy", "fsdp_cpu_offload", ABS_SCRIPT)
    assert argv[:2] == ["--nproc-per-node", "2"]


def test_node_zero_of_several_needs_no_main_address() -> None:
    """Node 0 hosts the rendezvous (on every interface), so Lightning's default address works there."""
    argv = command("--accelerator", "cpu", "--devices", "2", "--num-nodes", "3", ABS_SCRIPT)
    assert argv[:4] == ["--nproc-per-node", "2", "--max-restarts", "0"]
    assert argv[4:12] == ["--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "29500"]


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make starting torchrun a test failure, and the machine a CPU-only one (the same answers on a GPU machine)."""

    def must_not_run(*_: Any) -> int:
        raise AssertionError("torchrun was started despite an invalid flag")

    monkeypatch.setattr("fabric_lite.cli._run_torchrun", must_not_run)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine()))


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--devices", "abc", ABS_SCRIPT], ["--devices abc", "devices='abc'", "Example: devices=2"]),
        (["--accelerator", "cpu", "--devices", "0", ABS_SCRIPT], ["--devices 0", "at least one process"]),
        (["--accelerator", "cpu", "--devices", "0,1", ABS_SCRIPT], ["A list of indices selects GPUs"]),
        (["--accelerator", "cuda", ABS_SCRIPT], ["accelerator='cuda'", "no CUDA device", "Use accelerator='cpu'"]),
        (["--strategy", "single_device", "--devices", "2", ABS_SCRIPT], ["single_device", "Use strategy='ddp'"]),
        (["missing_script.py"], ["SCRIPT 'missing_script.py' does not exist", "looked in"]),
        ([str(REPO / "tests")], ["is a folder"]),
        (["--num-nodes", "2", "--node-rank", "2", "--main-address", "a", ABS_SCRIPT], ["--node-rank 2", "0 to 1"]),
        (
            ["--num-nodes", "2", "--node-rank", "1", ABS_SCRIPT],
            ["--node-rank 1 of --num-nodes 2 needs --main-address", "--node-rank 0"],
        ),
    ],
)
def test_invalid_flags_fail_before_anything_starts(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], no_launch: None
) -> None:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert "fabric-lite run: error:" in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        # Lightning's wording (click's), with the choices and why a known strategy is not one of them
        (
            ["--strategy", "ddp_spawn", ABS_SCRIPT],
            ["Invalid value for '--strategy': 'ddp_spawn' (its processes are started with spawn", "python", "ddp,"],
        ),
        (
            ["--strategy", "xla", ABS_SCRIPT],
            ["Invalid value for '--strategy': 'xla' (fabric_lite does not run on XLA/TPU)", "ddp,"],
        ),
        (["--strategy", "no_such_strategy", ABS_SCRIPT], ["'no_such_strategy' is not one of", "single_device"]),
        (["--accelerator", "tpu", ABS_SCRIPT], ["Invalid value for '--accelerator': 'tpu' is not one of", "cpu"]),
        (["--precision", "8", ABS_SCRIPT], ["Invalid value for '--precision': '8' is not one of", "bf16-mixed"]),
        (["--num-nodes", "0", ABS_SCRIPT], ["--num-nodes: 0 is out of range"]),
        (["--num-nodes", "two", ABS_SCRIPT], ["--num-nodes: 'two' is not an integer"]),
        (["--main-port", "70000", ABS_SCRIPT], ["--main-port: 70000 is out of range", "between 1 and 65535"]),
        (["--max-restarts", "-1", ABS_SCRIPT], ["--max-restarts: -1 is out of range"]),
        ([], ["the following arguments are required: SCRIPT"]),
    ],
)
def test_malformed_flags_are_usage_errors(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], no_launch: None
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.fixture
def recorded_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """torchrun's command lines, recorded instead of run, on a CPU-only machine; the environment is put back."""
    launches: list[list[str]] = []

    def record(torchrun_args: list[str], run_dir: str | None = None) -> int:
        launches.append(torchrun_args)
        return 0

    monkeypatch.setattr("fabric_lite.cli._run_torchrun", record)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine()))
    with mock.patch.dict(os.environ):
        for name in ("LT_CLI_USED", "LT_ACCELERATOR", "LT_STRATEGY", "LT_DEVICES", "LT_NUM_NODES", "LT_PRECISION"):
            os.environ.pop(name, None)
        yield launches


def test_lightnings_command_objects_run_the_cli_and_exit_with_its_status(
    recorded_launch: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`lightning.fabric.cli._run`, `_consolidate` and `_main` (the `fabric` console script) are called as click
    commands: `.main(args)` ends with SystemExit(status), and the flags reach the workers as Lightning's variables."""
    with pytest.raises(SystemExit) as exit_info:
        _run.main([ABS_SCRIPT, "--accelerator", "cpu", "--devices", "2"])
    assert exit_info.value.code == 0
    assert recorded_launch[-1][:2] == ["--nproc-per-node", "2"] and recorded_launch[-1][-1] == ABS_SCRIPT
    assert {k: v for k, v in os.environ.items() if k.startswith("LT_")} == {
        "LT_CLI_USED": "1",
        "LT_ACCELERATOR": "cpu",
        "LT_DEVICES": "2",
        "LT_NUM_NODES": "1",
    }
    assert _run.main([ABS_SCRIPT], standalone_mode=False) == 0
    with pytest.raises(SystemExit) as exit_info:
        _main.main(["run", "--num_nodes=1", ABS_SCRIPT, "--lr", "0.1"])
    assert exit_info.value.code == 0 and recorded_launch[-1][-3:] == [ABS_SCRIPT, "--lr", "0.1"]
    # usage errors exit with 2 and click's wording
    with pytest.raises(SystemExit) as exit_info:
        _run.main([ABS_SCRIPT, "--strategy", "ddp_spawn"])
    assert exit_info.value.code == 2
    assert "Invalid value for '--strategy': 'ddp_spawn'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        _consolidate.main(["no such folder"])
    assert exit_info.value.code == 2
    assert "Path 'no such folder' does not exist" in capsys.readouterr().err
    assert len(recorded_launch) == 3


@pytest.mark.parametrize(("devices", "expected"), [("1", 1), ("2", 2), ("0,", 1), ("1,0,2", 3), ("-1", 5)])
def test_processes_launched_for_gpu_indices_as_lightnings_cli(
    devices: str, expected: int, recorded_launch: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine(cuda_devices=5)))
    assert main(["run", ABS_SCRIPT, "--accelerator", "cuda", "--devices", devices]) == 0
    assert recorded_launch[-1][:2] == ["--nproc-per-node", str(expected)]
    assert os.environ["LT_DEVICES"] == devices


# a CLI setting against the same argument given to Fabric(...) in the script: (name, cli value, Fabric value)
AGREE = [
    ("devices", "2", 2),
    ("devices", "2", "2"),
    ("devices", "0,1", [0, 1]),
    ("accelerator", "cpu", "cpu"),
    ("accelerator", "cpu", CPUAccelerator()),
    ("strategy", "ddp", "ddp"),
    ("precision", "bf16", "bf16-mixed"),
    ("precision", "64-true", 64),
    ("num_nodes", "1", 1),
]


DISAGREE = [
    ("devices", "2", 3, "Fabric(devices=3, ...)"),
    ("devices", "2", [0, 1, 2], "Fabric(devices=[0, 1, 2], ...)"),
    ("accelerator", "cpu", "cuda", "Fabric(accelerator='cuda', ...)"),
    ("accelerator", "cuda", CPUAccelerator(), "Fabric(accelerator=CPUAccelerator(...), ...)"),
    ("strategy", "ddp", "single_device", "Fabric(strategy='single_device', ...)"),
    ("strategy", "ddp", DDPStrategy(), "Fabric(strategy=DDPStrategy(...), ...)"),
    ("precision", "bf16-mixed", "64-true", "Fabric(precision='64-true', ...)"),
    ("num_nodes", "1", 2, "Fabric(num_nodes=2, ...)"),
]


ENV = {"accelerator": "LT_ACCELERATOR", "strategy": "LT_STRATEGY", "devices": "LT_DEVICES"}


ENV |= {"num_nodes": "LT_NUM_NODES", "precision": "LT_PRECISION"}


@pytest.mark.parametrize(("name", "cli", "given"), AGREE)
def test_cli_setting_that_agrees_with_fabric(name: str, cli: str, given: Any) -> None:
    machine = Machine(cuda_devices=2) if name == "devices" and isinstance(given, list) else Machine()
    resolve_plan(env={ENV[name]: cli}, machine=machine, **{name: given})  # no error


@pytest.mark.parametrize(("name", "cli", "given", "in_script"), DISAGREE)
def test_cli_setting_that_disagrees_with_fabric_names_both(name: str, cli: str, given: Any, in_script: str) -> None:
    env = {ENV[name]: cli, "LT_CLI_USED": "1"}  # the script runs under `fabric run` / `fabric-lite run`
    with pytest.raises(ValueError) as excinfo:
        resolve_plan(env=env, machine=Machine(cuda_devices=4), **{name: given})
    message = str(excinfo.value)
    assert f"Your code has `{in_script}` but it conflicts with the value `--{name}={cli}`" in message, message
    assert f"{ENV[name]}={cli!r}" in message and "Give the value in one place only" in message


@pytest.mark.parametrize(("name", "cli", "given", "in_script"), DISAGREE)
def test_a_launcher_setting_replaces_the_argument_outside_the_cli(
    name: str, cli: str, given: Any, in_script: str
) -> None:
    """As in Lightning: the LT_* variables without LT_CLI_USED (set by another launcher) replace the argument."""
    env = {ENV[name]: cli, "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    plan, cli_only = (resolve_plan(env=env, machine=Machine(cuda_devices=4), **a) for a in ({name: given}, {}))
    assert getattr(plan, name) == getattr(cli_only, name)
    assert (plan.accelerator, plan.strategy, plan.devices, plan.precision, plan.num_nodes) == (
        cli_only.accelerator,
        cli_only.strategy,
        cli_only.devices,
        cli_only.precision,
        cli_only.num_nodes,
    )


def test_cli_settings_fill_arguments_left_at_their_default() -> None:
    env = {"LT_ACCELERATOR": "cuda", "LT_DEVICES": "0,1", "LT_PRECISION": "bf16-mixed"}
    env |= {"LT_STRATEGY": "ddp", "LT_NUM_NODES": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    plan = resolve_plan(env=env, machine=Machine(cuda_devices=2))
    assert (plan.accelerator, plan.devices, plan.precision) == ("cuda", (0, 1), "bf16-mixed")
    assert (plan.strategy, plan.num_nodes) == ("ddp", 2)


def test_cuda_accelerator_instance_agrees_with_cli_gpu() -> None:
    resolve_plan(env={"LT_ACCELERATOR": "gpu"}, accelerator=CUDAAccelerator(), machine=Machine(cuda_devices=1))


def test_consolidate_reports_a_missing_or_non_checkpoint_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    # a usage error, as in Lightning's `fabric consolidate` (click's wording)
    assert main(["consolidate", str(missing), "--output_file", str(tmp_path / "out.pt")]) == 2
    assert f"Invalid value for 'CHECKPOINT_FOLDER': Path {str(missing)!r} does not exist" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hi")
    assert main(["consolidate", str(plain)]) == 1
    err = capsys.readouterr().err
    assert "Only FSDP-sharded checkpoints saved with Lightning are supported" in err  # Lightning's wording
    assert "is not a sharded checkpoint" in err and "notes.txt" in err and str(plain) in err
    assert not (tmp_path / "out.pt").exists() and not (tmp_path / "plain.consolidated").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["consolidate"])
    assert exit_info.value.code == 2
    assert "CHECKPOINT_FOLDER" in capsys.readouterr().err
