"""The arguments of ``Fabric(...)`` as given: precision names, ``num_nodes``, and what a command-line launcher
passes through the environment. Pure functions, called by :func:`fabric_lite._plan.resolve_plan`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric_lite._cli_env import launched_by_cli
from fabric_lite.accelerators import Accelerator
from fabric_lite.accelerators.accelerator import accelerator_name
from fabric_lite.strategies.strategy import Strategy

#: canonical precision names (the transformer-engine ones: FP8 through NVIDIA's Transformer Engine, with bfloat16 or
#: float16 weights)
PRECISIONS = (
    "32-true",
    "64-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "transformer-engine",
    "transformer-engine-float16",
)
_LEGACY_PRECISIONS: dict[Any, str] = {
    32: "32-true",
    "32": "32-true",
    64: "64-true",
    "64": "64-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}


def parse_num_nodes(num_nodes: Any) -> int:
    """``num_nodes`` as an int >= 1 (a string of digits counts, as in Lightning); ``TypeError`` if it is not a
    whole number, ``ValueError`` below 1."""
    if isinstance(num_nodes, str) and num_nodes.strip().isascii() and num_nodes.strip().isdigit():
        num_nodes = int(num_nodes)  # Lightning accepts strings (e.g. straight from argparse)
    if type(num_nodes) is not int:
        raise TypeError(f"`num_nodes` must be a positive integer, but got {num_nodes!r}. Example: num_nodes=2.")
    if num_nodes < 1:
        raise ValueError(f"`num_nodes` must be a positive integer, but got {num_nodes}. Example: num_nodes=1.")
    return num_nodes


def canonical_precision(precision: Any) -> tuple[str, list[str]]:
    """The canonical name of ``precision`` (one of :data:`PRECISIONS`), with a warning for a legacy spelling of a mixed
    precision (``16``, ``"bf16"``); ``ValueError`` listing the allowed values for any other."""
    if precision is None:
        return "32-true", []
    if isinstance(precision, str) and precision in PRECISIONS:
        return precision, []
    if type(precision) in (int, str) and precision in _LEGACY_PRECISIONS:
        canonical = _LEGACY_PRECISIONS[precision]
        warnings = []
        if canonical.endswith("mixed"):
            warnings.append(
                f"`precision={precision}` is supported for historical reasons but its usage is discouraged."
                f" Please set your precision to {canonical} instead! (Fabric(precision={precision!r}) means"
                f" {canonical!r}: write precision={canonical!r}.)"
            )
        return canonical, warnings
    allowed = list(PRECISIONS) + [repr(k) for k in _LEGACY_PRECISIONS]
    raise ValueError(f"Precision {precision!r} is invalid. Allowed precision values: {', '.join(allowed)}.")


#: how a command-line launcher hands its flags to ``Fabric(...)`` in the script: argument name -> environment variable.
#: ``fabric-lite run`` sets Lightning Fabric's own variables, so a script started by either command reads them alike
CLI_ENV_VARS = {name: "LT_" + name.upper() for name in ("accelerator", "strategy", "devices", "num_nodes", "precision")}


def _same_setting(name: str, given: Any, from_cli: str) -> bool:
    """Whether ``Fabric(name=given)`` says the same as the CLI's ``from_cli`` (spellings differ: 2 and "2")."""
    cli = from_cli.strip()
    if name == "accelerator":
        label = accelerator_name(given) if isinstance(given, Accelerator) else str(given).lower()
        return label == cli.lower() or (cli.lower() == "gpu" and label in ("cuda", "mps"))
    if name == "strategy":
        return isinstance(given, str) and given.lower() == cli.lower()
    if name == "devices":
        if isinstance(given, (list, tuple)):
            given = ",".join(str(v) for v in given)
        return str(given).replace(" ", "") == cli.replace(" ", "")
    if name == "precision":
        try:
            return canonical_precision(given)[0] == canonical_precision(cli)[0]
        except ValueError:
            return str(given) == cli
    return str(given).strip() == cli


def _is_default(name: str, given: Any) -> bool:
    if name == "precision":
        return given is None or (isinstance(given, (str, int)) and given in ("32-true", "32", 32))
    if name == "num_nodes":
        return type(given) is int and given == 1
    return isinstance(given, str) and given == "auto"


def with_cli_settings(env: Mapping[str, str], **given: Any) -> dict[str, Any]:
    """``Fabric(...)``'s arguments with the values a command-line launcher put in ``env`` (:data:`CLI_ENV_VARS`).

    A value in the environment replaces the argument, as in Lightning. Under the command line itself, a script
    argument that disagrees raises ``ValueError`` naming both: preferring either would run a job one did not ask for.
    """
    settings = dict(given)
    under_cli = launched_by_cli(env)
    for name, variable in CLI_ENV_VARS.items():
        from_cli = env.get(variable)
        if from_cli is None:
            continue
        current = given[name]
        if under_cli and not _is_default(name, current) and not _same_setting(name, current, from_cli):
            shown = f"{type(current).__name__}(...)" if isinstance(current, (Strategy, Accelerator)) else repr(current)
            raise ValueError(
                f"Your code has `Fabric({name}={shown}, ...)` but it conflicts with the value `--{name}={from_cli}`"
                f" set through the CLI (`fabric run` / `fabric-lite run`; {variable}={from_cli!r} in the"
                f" environment). Give the value in one place only: remove {name}= from Fabric(...), or change the"
                " command-line flag to agree with it."
            )
        settings[name] = from_cli
    return settings
