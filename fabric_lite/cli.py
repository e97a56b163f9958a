"""``fabric-lite run``: start a training script on one machine or several through torchrun's elastic agent;
``fabric-lite consolidate``: turn a sharded checkpoint folder into one file. The command line is Lightning's
``fabric run``; the flags reach ``Fabric()`` in the script through the environment."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric_lite._cli_env import CLI_USED_ENV_VAR
from fabric_lite._plan import (
    _ACCELERATOR_CHOICES,
    _LEGACY_PRECISIONS,
    CLI_ENV_VARS,
    PRECISIONS,
    Machine,
    resolve_plan,
)
from fabric_lite.as_lightning import ENV_VAR as AS_LIGHTNING_ENV_VAR
from fabric_lite.strategies.registry import STRATEGY_REGISTRY, StrategyEntry
from fabric_lite.utilities._fs import _is_remote, _local_path
from fabric_lite.utilities.consolidate_checkpoint import add_consolidate_arguments, run_consolidate


def _not_for_the_cli(name: str, entry: StrategyEntry) -> str | None:
    """Why ``fabric-lite run --strategy name`` is refused (as Lightning's ``fabric run`` refuses it), or None."""
    if re.search("xla|tpu", name):
        return "fabric_lite does not run on XLA/TPU"
    if entry.parallel and entry.start_method != "popen":
        # torchrun starts the processes: one per device, each like a script re-run (``popen``)
        how = f"with {entry.start_method}" if entry.start_method else "by its own launcher (e.g. horovodrun)"
        return f"its processes are started {how}, not by torchrun; run the script with python instead"
    return None


#: the strategies ``fabric-lite run --strategy`` takes: every registry name and alias whose processes torchrun can
#: start (offloading ones too, which Lightning's ``fabric run`` leaves out: :func:`_get_supported_strategies`)
CLI_STRATEGIES = (
    "auto",
    *(
        name
        for name, entry in (*STRATEGY_REGISTRY.items(), *STRATEGY_REGISTRY.aliases.items())
        if _not_for_the_cli(name, entry) is None
    ),
)
CLI_PRECISIONS = (*PRECISIONS, *(key for key in _LEGACY_PRECISIONS if isinstance(key, str)))
#: torchrun's default port, used by every node of a multi-node job unless --main-port says otherwise
DEFAULT_MULTI_NODE_PORT = 29500

_DESCRIPTION = """\
Run SCRIPT on this machine's devices, and with --num-nodes on several machines, through torch's elastic agent
(torch.distributed.run): it starts one process per device, restarts them all after a failure (--max-restarts)
and reports the first failure as the root cause. Fabric() in the script takes its settings from these flags;
an argument given to Fabric(...) that disagrees with a flag is an error naming both.

The flags below may come before or after SCRIPT (as with Lightning's `fabric run`); any other argument after
SCRIPT, and everything after `--`, is passed to the script unchanged."""

_EXAMPLES = """\
examples:
  # two processes on the CPU; --lr 0.1 goes to train.py
  fabric-lite run --accelerator cpu --devices 2 train.py --lr 0.1

  # every GPU of this machine, with bf16 mixed precision
  fabric-lite run --accelerator cuda --devices -1 --precision bf16-mixed train.py

  # two machines with 8 GPUs each: the same command on both, --node-rank 0 on 10.0.0.1 and 1 on the other
  fabric-lite run --devices 8 --num-nodes 2 --node-rank 0 --main-address 10.0.0.1 --main-port 29500 train.py

  # restart every process up to 3 times after a failure; the script resumes from its last checkpoint
  fabric-lite run --accelerator cpu --devices 2 --max-restarts 3 train.py

  # the same without the console script
  python -m fabric_lite run --accelerator cpu --devices 2 train.py

  # Lightning's order and spellings: flags after SCRIPT, --devices=2, --num_nodes; --epochs goes to train.py
  fabric-lite run train.py --accelerator=cpu --devices=2 --num_nodes=1 --epochs 3

  # code written against Lightning Fabric, unmodified (here litgpt, run as a module like `python -m litgpt`)
  fabric-lite run --accelerator cpu --devices 2 --as-lightning -m litgpt pretrain --config tiny.yaml

  # a script flag with the same name as one of these: put the script's arguments after --
  fabric-lite run --devices 2 train.py -- --devices 4

On several machines, every node needs to reach --main-address:--main-port, and gloo must use the network
interface that carries that address: set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for NCCL), e.g. eth0."""


@dataclass(frozen=True)
class LaunchCommand:
    """What ``fabric-lite run`` does once its flags are checked.

    Example::

        command = launch_command(build_parser().parse_args(["run", "--devices", "2", "train.py"]), Machine())
        command.env  # {'LT_CLI_USED': '1', 'LT_DEVICES': '2', 'LT_NUM_NODES': '1'}
    """

    #: the arguments for ``torch.distributed.run``
    torchrun_args: list[str]
    #: variables to add to the environment of every worker (the settings for ``Fabric()``)
    env: dict[str, str]
    #: processes started on this node
    nproc_per_node: int


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give an integer {bound}")
        return value

    parse.__name__ = "integer"
    return parse


def _one_of(flag: str, choices: Sequence[str], refused: Callable[[str], str | None] = lambda _: None) -> dict[str, Any]:
    """The ``type=`` and ``metavar=`` of ``flag``, which takes one of ``choices``; anything else is a usage error
    worded as click's in ``fabric run``, saying why (``refused``) a known name is not accepted."""

    def parse(text: str) -> str:
        if text in choices:
            return text
        why = refused(text)
        because = f" ({why})" if why else ""
        # an ArgumentError without an action: argparse prints the message as it is, as a usage error (exit 2)
        raise argparse.ArgumentError(
            None, f"Invalid value for '{flag}': {text!r}{because} is not one of {', '.join(choices)}."
        )

    parse.__name__ = flag.lstrip("-")
    return {"type": parse, "metavar": "{" + ",".join(choices) + "}"}


def _refused_strategy(name: str) -> str | None:
    return _not_for_the_cli(name, STRATEGY_REGISTRY[name]) if name in STRATEGY_REGISTRY else None


class _CommandParser(argparse.ArgumentParser):
    """The parser of a ``fabric-lite`` command. ``run`` takes its flags before or after SCRIPT, as Lightning's
    ``fabric run`` does, and gives the script every other argument after SCRIPT."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if not any(action.dest == "script_args" for action in self._actions):
            return super().parse_known_args(args, namespace)
        ours, script_args = self._split(list(sys.argv[1:] if args is None else args))
        parsed, unknown = super().parse_known_args(ours, namespace)
        parsed.script_args = [*parsed.script_args, *script_args]
        if parsed.script is None and parsed.module is None:
            self.error("the following arguments are required: SCRIPT (or -m MODULE)")
        return parsed, unknown

    def _split(self, tokens: list[str]) -> tuple[list[str], list[str]]:
        """(``run``'s flags with SCRIPT last, the script's arguments)."""
        takes_value = {
            flag: action.nargs != 0 for action in self._actions for flag in action.option_strings
        }  # --help takes none
        ours: list[str] = []
        script: list[str] = []
        script_args: list[str] = []
        index = 0
        while index < len(tokens):
            token = tokens[index]
            index += 1
            if token == "--":
                rest = tokens[index:]
                if not script and rest:
                    script, rest = ["--", rest[0]], rest[1:]  # `--` keeps a SCRIPT that starts with "-" a SCRIPT
                script_args += rest
                break
            flag = token.split("=", 1)[0]
            if flag in ("-m", "--module") and not script:
                # `-m MODULE ARGS...`, as with `python -m`: everything after MODULE is the module's
                ours.append(token)
                if "=" not in token and index < len(tokens):
                    ours.append(tokens[index])
                    index += 1
                script_args += tokens[index:]
                break
            if flag in takes_value:
                ours.append(token)
                if takes_value[flag] and "=" not in token and index < len(tokens):
                    ours.append(tokens[index])
                    index += 1
            elif script:
                script_args.append(token)
            elif token.startswith("-") and token != "-":
                ours.append(token)  # an unknown flag before SCRIPT: argparse reports it
            else:
                script = [token]
        return [*ours, *script], script_args


# fmt: off
#: ``fabric-lite run``'s settings: each flag with what ``argparse`` takes for it
_RUN_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--accelerator", {
        **_one_of("--accelerator", _ACCELERATOR_CHOICES),
        "help": "the hardware to run on; 'auto' picks CUDA, then MPS, then the CPU (e.g. --accelerator cpu)."
        " Default: what Fabric(accelerator=...) in the script says, else 'auto'.",
    }),
    ("--strategy", {
        **_one_of("--strategy", CLI_STRATEGIES, _refused_strategy),
        "help": "how the processes work together (e.g. --strategy ddp). Default: what Fabric(strategy=...) in the"
        " script says, else 'auto' (ddp for several processes). Strategies that start their own processes"
        " (ddp_spawn, ...) are set in the script's Fabric(...).",
    }),
    ("--devices", {
        "default": "1",
        "help": "devices per node, one process each: a count (on the CPU, the number of processes), -1 or 'auto'"
        " for every GPU, or GPU indices such as 0,2 (e.g. --devices 2). Default: 1.",
    }),
    ("--num-nodes", {
        "type": _int_at_least(1), "default": 1, "metavar": "N",
        "help": "how many machines take part (e.g. --num-nodes 2); run the command on each. Default: 1.",
    }),
    ("--node-rank", {
        "type": _int_at_least(0), "default": 0, "metavar": "RANK",
        "help": "this machine's index, 0 .. N-1; node 0 hosts the rendezvous (e.g. --node-rank 1). Default: 0.",
    }),
    ("--main-address", {
        "metavar": "ADDRESS",
        "help": "address of node 0 that every node can reach (e.g. --main-address 10.0.0.1). Needed on every node"
        " but node 0 with --num-nodes > 1. Default: 127.0.0.1 (node 0 hosts the rendezvous).",
    }),
    ("--main-port", {
        "type": _int_at_least(1, 65535), "metavar": "PORT",
        "help": "a free TCP port on node 0 for the rendezvous (e.g. --main-port 29500). Default: with several"
        f" nodes {DEFAULT_MULTI_NODE_PORT}; on one node a free port that torchrun picks itself (no port clash).",
    }),
    ("--precision", {
        **_one_of("--precision", CLI_PRECISIONS),
        "help": "numeric precision (e.g. --precision bf16-mixed). Default: what Fabric(precision=...) in the script"
        " says, else '32-true'.",
    }),
    ("--max-restarts", {
        "type": _int_at_least(0), "default": 0, "metavar": "N",
        "help": "restart every process of this node up to N times after a failure; each restart runs the script"
        " from the start (TORCHELASTIC_RESTART_COUNT tells which attempt), so it should resume from its last"
        " checkpoint (e.g. --max-restarts 3). Default: 0.",
    }),
]
# fmt: on


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fabric-lite``, with its ``run`` and ``consolidate`` commands.

    Example::

        build_parser().parse_args(["run", "--devices", "2", "train.py", "--lr", "0.1"]).script_args  # ['--lr', '0.1']
    """
    parser = argparse.ArgumentParser(
        prog="fabric-lite",
        description="fabric_lite's command line. `fabric-lite run --help` and `fabric-lite consolidate --help`"
        " explain the commands.",
        epilog="examples:\n  fabric-lite run --accelerator cpu --devices 2 train.py --lr 0.1\n"
        "  fabric-lite consolidate checkpoints/step-1000 --output_file step-1000.ckpt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    run = commands.add_parser(
        "run",
        help="run a training script on one or more processes and machines (see `fabric-lite run --help`)",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    for flag, settings in _RUN_FLAGS:
        run.add_argument(flag, **settings)
    # Lightning's spellings with underscores (its click options take both): the same settings, not listed twice
    for action in list(run._actions):
        for flag in action.option_strings:
            if flag.startswith("--") and "-" in flag[2:]:
                alias = run.add_argument(
                    "--" + flag[2:].replace("-", "_"),
                    dest=action.dest,
                    metavar=action.metavar,
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
                alias.type = action.type
    run.add_argument(
        "--as-lightning",
        action="store_true",
        help="run code written against Lightning Fabric unmodified: `lightning.fabric`, `lightning_fabric` and"
        " `lightning.Fabric` are fabric_lite's in every process (fabric_lite.as_lightning's import hook;"
        " e.g. --as-lightning -m litgpt pretrain ...).",
    )
    run.add_argument(
        "-m",
        "--module",
        metavar="MODULE",
        help="run a module instead of a script, as `python -m MODULE` does; every argument after MODULE is the"
        " module's (e.g. -m litgpt pretrain --devices 2).",
    )
    run.add_argument(
        "script", metavar="SCRIPT", nargs="?", default=None, help="the Python script to run (e.g. train.py)"
    )
    run.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT_ARGS",
        help="arguments for the script, passed unchanged (e.g. --lr 0.1)",
    )
    consolidate = commands.add_parser(
        "consolidate",
        help="turn a sharded checkpoint folder (FSDPStrategy) into one file (see `fabric-lite consolidate --help`)",
        description=_CONSOLIDATE_DESCRIPTION,
        epilog="example:\n  fabric-lite consolidate checkpoints/step-1000 --output_file step-1000.ckpt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_consolidate_arguments(consolidate)
    return parser


def _flags(args: argparse.Namespace) -> str:
    given = [
        f"--{name.replace('_', '-')} {getattr(args, name)}"
        for name in CLI_ENV_VARS
        if getattr(args, name) is not None and not (name == "num_nodes" and args.num_nodes == 1)
    ]
    return " ".join(["fabric-lite run", *given])


def _program(args: argparse.Namespace) -> list[str]:
    """What ``fabric_lite._run_script`` runs in each worker: ``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]``."""
    if args.module is not None:
        top = args.module.partition(".")[0]  # not the module itself: that would import its package here
        if not args.module or importlib.util.find_spec(top) is None:
            raise ValueError(
                f"-m {args.module!r}: no module {top!r} can be imported with this interpreter ({sys.executable})."
                " Install it here, or give a script instead (e.g. train.py)."
            )
        return ["-m", args.module, *args.script_args]
    if args.script is None:
        raise ValueError("give the SCRIPT to run (e.g. train.py), or -m MODULE (e.g. -m litgpt pretrain ...).")
    script = Path(args.script)
    if not script.is_file():
        where = "is a folder" if script.is_dir() else f"does not exist (looked in {Path.cwd()})"
        raise ValueError(f"SCRIPT {args.script!r} {where}. Give the path of a Python file, e.g. train.py.")
    return [args.script, *args.script_args]


def launch_command(args: argparse.Namespace, machine: Machine) -> LaunchCommand:
    """Check the flags of ``fabric-lite run`` as ``Fabric()`` will check them in each worker, so that a bad flag
    fails before any process starts, and turn them into a ``torch.distributed.run`` command line.

    Raises:
        ValueError, TypeError, RuntimeError: a flag that cannot work; the message names it and the fix.

    Example::

        launch_command(args, Machine()).torchrun_args  # ['--nproc-per-node', '2', ..., 'train.py']
    """
    program = _program(args)
    if args.node_rank >= args.num_nodes:
        raise ValueError(
            f"--node-rank {args.node_rank} is not a node of --num-nodes {args.num_nodes}: node ranks run from 0 to"
            f" {args.num_nodes - 1}. Give each machine its own --node-rank in that range."
        )
    if args.node_rank > 0 and not args.main_address:
        # node 0 hosts the rendezvous, reachable on every interface, so it needs no address; another node would
        # look for it on itself and wait until the timeout
        raise ValueError(
            f"--node-rank {args.node_rank} of --num-nodes {args.num_nodes} needs --main-address: the address of"
            " the machine started with --node-rank 0, reachable from every node (e.g. --main-address 10.0.0.1)."
        )
    env = {
        CLI_USED_ENV_VAR: "1",
        CLI_ENV_VARS["devices"]: str(args.devices),
        CLI_ENV_VARS["num_nodes"]: str(args.num_nodes),
    }
    if args.as_lightning:
        env[AS_LIGHTNING_ENV_VAR] = "1"  # each worker turns the hook on at start-up (fabric_lite-as-lightning.pth)
    for name in ("accelerator", "strategy", "precision"):
        if getattr(args, name) is not None:
            env[CLI_ENV_VARS[name]] = str(getattr(args, name))
    address = args.main_address or "127.0.0.1"
    try:
        # how many processes Fabric() with these settings runs per node: what torchrun must start
        nproc = resolve_plan(env={**env, "MASTER_ADDR": address, "MASTER_PORT": "0"}, machine=machine).num_processes
        # and what Fabric() will say in every worker, with the environment torchrun gives it (under the CLI it also
        # checks the settings against torchrun's, as launch() does elsewhere)
        worker_env = {
            **env,
            "TORCHELASTIC_RUN_ID": "fabric-lite-check",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "GROUP_RANK": str(args.node_rank),
            "WORLD_SIZE": str(nproc * args.num_nodes),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": address,
            "MASTER_PORT": str(args.main_port or 0),
        }
        resolve_plan(env=worker_env, machine=machine).validate_settings()
    except (ValueError, TypeError, RuntimeError) as err:
        raise type(err)(f"`{_flags(args)}` cannot work: {err}") from None

    torchrun_args = ["--nproc-per-node", str(nproc), "--max-restarts", str(args.max_restarts)]
    if args.num_nodes == 1 and args.main_port is None:
        # c10d rendezvous on a port the agent binds itself: no free-port guess that another job could take first
        torchrun_args.append("--standalone")
    else:
        port = args.main_port if args.main_port is not None else DEFAULT_MULTI_NODE_PORT
        torchrun_args += ["--nnodes", str(args.num_nodes), "--node-rank", str(args.node_rank)]
        torchrun_args += ["--master-addr", address, "--master-port", str(port)]
    torchrun_args += ["--module", "fabric_lite._run_script", *program]
    return LaunchCommand(torchrun_args=torchrun_args, env=env, nproc_per_node=nproc)


_CONSOLIDATE_DESCRIPTION = """\
Convert a sharded checkpoint folder (what fabric.save writes with FSDPStrategy()) into a single file that
torch.load reads, without fabric_lite, a process group or a GPU (Lightning's `fabric consolidate`)."""


def _run_torchrun(torchrun_args: list[str], run_dir: str | None = None) -> int:
    # imported here: `fabric-lite --help` and flag errors should not wait for torch's elastic package
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from fabric_lite.runtime.diagnostics import hang_report as _hang_report
    from fabric_lite.runtime.supervision import describe, from_torchrun

    try:
        run(parse_args(torchrun_args))  # type: ignore[no-untyped-call]
    except ChildFailedError as err:
        # the agent has stopped every process of this node; its report names the first failure: the root cause.
        # The failing rank printed the hang report already (or does so below): it is not repeated
        print(f"fabric-lite run: the job failed.\n{_hang_report.without_block(str(err))}", file=sys.stderr, flush=True)
        cause = from_torchrun(err.failures)
        if cause is not None:
            print(f"fabric-lite run: root cause: {describe(cause, traceback=False)}", file=sys.stderr, flush=True)
        if run_dir is not None:
            # no rank reported where every rank was (one died before it could): the trails still tell
            codes = {rank: failure.exitcode for rank, failure in err.failures.items()}
            block = _hang_report.collect(
                run_dir, reason=f"rank(s) {sorted(codes)} ended", exit_codes=codes, stacks=False
            )
            if block:
                print(block, file=sys.stderr, flush=True)
        return 1
    except SignalException as err:
        print(f"fabric-lite run: stopped by {err.sigval.name}; every process was stopped.", file=sys.stderr)
        return 128 + int(err.sigval)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fabric-lite`` command (also ``python -m fabric_lite``). Returns the exit status.

    Example::

        main(["run", "--accelerator", "cpu", "--devices", "2", "train.py", "--lr", "0.1"])  # 0 on success
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "consolidate":
        folder = args.checkpoint_folder
        if not _is_remote(folder) and not os.path.exists(_local_path(folder)):
            # a usage error, as in `fabric consolidate` (click checks the path before anything runs)
            print(
                "usage: fabric-lite consolidate CHECKPOINT_FOLDER [--output_file FILE]\nfabric-lite consolidate: error:"
                f" Invalid value for 'CHECKPOINT_FOLDER': Path {folder!r} does not exist.",
                file=sys.stderr,
            )
            return 2
        return run_consolidate(args)
    if args.command != "run":
        parser.print_help(sys.stderr)
        return 2
    try:
        command = launch_command(args, Machine.detect())
    except (ValueError, TypeError, RuntimeError) as err:
        print(
            f"usage: fabric-lite run [flags] (SCRIPT | -m MODULE) [ARGS...]\nfabric-lite run: error: {err}",
            file=sys.stderr,
        )
        return 2
    os.environ.update(command.env)  # the workers inherit this process's environment
    # torchrun gives every worker OMP_NUM_THREADS=1 when it is unset (with a warning); share this machine's cores
    # among the processes instead, as fabric_lite's own launchers do (Lightning's `fabric run` gives each of them
    # all the cores, oversubscribing)
    from fabric_lite.utilities.distributed import _suggested_max_num_threads

    os.environ.setdefault("OMP_NUM_THREADS", str(_suggested_max_num_threads(command.nproc_per_node)))
    from fabric_lite.runtime.diagnostics import trail as _trail
    from fabric_lite.runtime.run import RunContext

    # the ranks' trails of collectives, for the hang report (see fabric_lite.runtime.diagnostics.hang_report); the
    # workers, new programs started by torchrun's agent, read the run from their environment
    run_dir = _trail.make_run_dir()
    os.environ.update(RunContext(launcher="cli", run_dir=run_dir).environment())
    try:
        return _run_torchrun(command.torchrun_args, run_dir)
    finally:
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)


def _get_supported_strategies() -> list[str]:
    """Lightning's list for ``fabric run --strategy``: registry names (no aliases) torchrun can start, without the
    offloading ones. ``fabric-lite run`` takes more (:data:`CLI_STRATEGIES`)."""
    return [
        name for name in STRATEGY_REGISTRY.available_strategies() if name in CLI_STRATEGIES and "offload" not in name
    ]


class _Command:
    """A ``fabric-lite`` command called as Lightning's click commands are: ``_run.main(["train.py"])`` ends with
    ``SystemExit(status)``, or returns it with ``standalone_mode=False`` (a usage error still exits with 2)."""

    def __init__(self, command: str | None) -> None:
        self._command = command

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> int:
        argv = list(sys.argv[1:] if args is None else args)
        status = main(argv if self._command is None else [self._command, *argv])
        if standalone_mode:
            raise SystemExit(status)
        return status

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        return self.main(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<fabric-lite {self._command or 'command line'}>"


#: Lightning's names for the commands: ``fabric run ...`` (``_run``), ``fabric consolidate ...`` (``_consolidate``),
#: and the ``fabric`` console script itself (``_main``), which the import hook serves from this module
_main = _Command(None)
_run = _Command("run")
_consolidate = _Command("consolidate")
