"""Drop-in at the import line: every public name of Lightning Fabric 2.6.6 exists at the same path in fabric_lite,
with a call signature that accepts every call Lightning's accepts.

The reference is ``tests/data/lightning_fabric_surface.json``, written by ``tests/helpers/scripts/lightning_surface.py``
from the installed Lightning Fabric (its docstring says how to refresh it); where the comparison venv exists, a test
keeps the file equal to what the installed reference prints. Names that fabric_lite leaves out on purpose are in
``EXCLUDED``, each with its reason. Behaviour is tested elsewhere, name by name (tests/test_utilities_*.py,
tests/distributed/test_collective_plugins.py, tests/unit/test_environments.py, ...); this file checks that nothing is
missing.

"Compatible" means: every parameter of Lightning's callable can be passed the same way to ours (a positional
parameter sits at the same position under the same name; a keyword is accepted by name, or by ``**kwargs``), and
ours requires nothing that Lightning's does not.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
from typing import Any

import pytest

from tests.helpers.harness import REPO, base_env, lightning_python, run_python

SNAPSHOT = REPO / "tests" / "data" / "lightning_fabric_surface.json"
DUMPER = REPO / "tests" / "helpers" / "scripts" / "lightning_surface.py"

_XLA = "XLA/TPU: needs torch_xla and a TPU, neither of which exists for this project's machines"

#: Lightning names fabric_lite does not have, and why
EXCLUDED: dict[str, str] = {}

#: names outside Lightning's public surface that public clients import (the snapshot's ``client_imports``) which
#: fabric_lite does not provide, and why; docs/migration.md lists them with the rest of the ranking
_ONE_CLIENT = "imported by one public client only (docs/migration.md's ranking)"
EXCLUDED_CLIENT_IMPORTS: dict[str, str] = {}

#: parameters of names that fabric_lite has, left out for now, and why
EXCLUDED_PARAMETERS: dict[tuple[str, str], str] = {}

#: names that fabric_lite has whose whole call signature differs from Lightning's, and why
EXCLUDED_SIGNATURES: dict[str, str] = {
    "lightning_fabric.strategies.launchers.subprocess_script._SubprocessScriptLauncher": (
        "the name of fabric_lite's SubprocessScriptLauncher (for imports and isinstance checks), which is built from"
        " the strategy, not from (environment, processes, nodes): a custom strategy subclasses DDPStrategy or"
        " ParallelStrategy, which make it"
    ),
    "lightning_fabric.utilities.load._NotYetLoadedTensor": (
        "clients only meet it (isinstance, _load_tensor(), its tensor attributes): it is made by _lazy_load alone, from"
        " a tensor of the mapped file rather than from Lightning's unpickler records"
    ),
}

#: strategy registry names fabric_lite does not register, and why
EXCLUDED_STRATEGIES: dict[str, str] = {}


def _reference() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text())  # type: ignore[no-any-return]


REFERENCE = _reference()
NAMES: dict[str, dict[str, Any]] = REFERENCE["names"]
CLIENT_IMPORTS: dict[str, dict[str, Any]] = REFERENCE["client_imports"]


def _ours(lightning_path: str) -> Any:
    """The object at Lightning's path with ``lightning_fabric`` replaced by ``fabric_lite``; raises LookupError."""
    parts = ["fabric_lite", *lightning_path.split(".")[1:]]
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            # a class member as defined (a property stays a property); a module member as imported
            obj = inspect.getattr_static(obj, attr, None) if inspect.isclass(obj) else getattr(obj, attr, None)
            if obj is None:
                raise LookupError(f"{'.'.join(parts)} does not exist ({attr!r} is missing)")
        return obj
    raise LookupError(f"no module of {'.'.join(parts)} can be imported")


def _parameters(obj: Any) -> list[inspect.Parameter]:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]


def incompatibilities(path: str, lightning_params: list[list[Any]], ours: Any) -> list[str]:
    """How a call that Lightning's signature accepts could fail with ours (empty: compatible)."""
    params = _parameters(ours)
    by_name = {p.name: p for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    has_var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    problems = []
    theirs_names = set()
    position = 0
    for name, kind, _has_default in lightning_params:
        theirs_names.add(name)
        if (path, name) in EXCLUDED_PARAMETERS:
            position += kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
            continue
        if kind == "VAR_POSITIONAL":
            if not has_var_pos:
                problems.append(f"*{name}: Lightning takes extra positional arguments, ours does not")
            continue
        if kind == "VAR_KEYWORD":
            if not has_var_kw:
                problems.append(f"**{name}: Lightning takes any keyword argument, ours does not")
            continue
        if kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
            mine = positional[position] if position < len(positional) else None
            if mine is None and not has_var_pos:
                problems.append(f"{name!r} (position {position}): ours takes no argument at that position")
            elif mine is not None and mine.name != name and kind == "POSITIONAL_OR_KEYWORD":
                problems.append(f"{name!r} (position {position}): ours has {mine.name!r} there")
            position += 1
        if kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"):
            mine = by_name.get(name)
            if (mine is None or mine.kind is mine.POSITIONAL_ONLY) and not has_var_kw:
                problems.append(f"{name!r}: ours does not accept it by name")
    for p in params:
        required = p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if required and p.name not in theirs_names:
            problems.append(f"{p.name!r}: ours requires it, Lightning's has no such parameter")
    return problems


@pytest.mark.parametrize("path", sorted(set(NAMES) - set(EXCLUDED)))
def test_name_exists_with_a_compatible_signature(path: str) -> None:
    _check_counterpart(path, NAMES[path])


@pytest.mark.parametrize("path", sorted(set(CLIENT_IMPORTS) - set(EXCLUDED_CLIENT_IMPORTS)))
def test_a_name_public_clients_import_exists_with_a_compatible_signature(path: str) -> None:
    """Private names and private modules that public code imports from Lightning Fabric (litgpt's first)."""
    _check_counterpart(path, CLIENT_IMPORTS[path])


def _check_counterpart(path: str, info: dict[str, Any]) -> None:
    try:
        ours = _ours(path)
    except LookupError as err:
        pytest.fail(f"{path} has no counterpart in fabric_lite: {err}")
    if info["kind"] == "class":
        assert inspect.isclass(ours), f"{path} is a class in Lightning; ours is {type(ours).__name__}"
    if info["kind"] == "type alias":  # Lightning's Union[...]/Literal[...]: ours an alias too (typing or X | Y)
        assert type(ours).__module__ == "typing" or isinstance(ours, types.UnionType), f"{path}: not a type alias"
    if info["kind"] == "property":
        assert isinstance(ours, property), f"{path} is a property in Lightning; ours is {type(ours).__name__}"
    if info["kind"] in ("function", "method"):
        assert callable(ours) or isinstance(ours, (staticmethod, classmethod)), f"{path} is not callable in ours"
    if path in EXCLUDED_SIGNATURES:
        return
    if info["params"] is not None and (callable(ours) or isinstance(ours, (staticmethod, classmethod))):
        problems = incompatibilities(path, info["params"], ours)
        assert not problems, f"{path}: a call Lightning accepts fails with ours:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", sorted(set(REFERENCE["strategies"]) - set(EXCLUDED_STRATEGIES)))
def test_strategy_name_is_registered(name: str) -> None:
    from fabric_lite.strategies import STRATEGY_REGISTRY

    assert name in STRATEGY_REGISTRY, f"Fabric(strategy={name!r}) works in Lightning, not in fabric_lite"


def test_exclusions_are_real_names() -> None:
    """An exclusion that names nothing in the reference (a typo, a name since added) would hide nothing: refuse."""
    assert set(EXCLUDED) <= set(NAMES), sorted(set(EXCLUDED) - set(NAMES))
    assert set(EXCLUDED_CLIENT_IMPORTS) <= set(CLIENT_IMPORTS), sorted(
        set(EXCLUDED_CLIENT_IMPORTS) - set(CLIENT_IMPORTS)
    )
    assert {path for path, _ in EXCLUDED_PARAMETERS} <= set(NAMES) | set(CLIENT_IMPORTS)
    assert set(EXCLUDED_SIGNATURES) <= set(NAMES) | set(CLIENT_IMPORTS)
    assert set(EXCLUDED_STRATEGIES) <= set(REFERENCE["strategies"])


def test_excluded_names_are_really_missing() -> None:
    """An excluded name that fabric_lite has since gained must come off the list, so its signature is checked."""
    present = []
    for path in [*EXCLUDED, *EXCLUDED_CLIENT_IMPORTS]:
        try:
            _ours(path)
        except LookupError:
            continue
        present.append(path)
    assert not present, f"remove these from EXCLUDED, fabric_lite has them now: {present}"
    from fabric_lite.strategies import STRATEGY_REGISTRY

    registered = sorted(set(EXCLUDED_STRATEGIES) & set(STRATEGY_REGISTRY))
    assert not registered, f"remove these from EXCLUDED_STRATEGIES, fabric_lite registers them now: {registered}"


def test_the_checker_finds_incompatibilities() -> None:
    """The comparison itself: each way a signature can refuse a Lightning call is reported."""

    def same(a: int, b: int = 1, *, c: int = 2) -> None: ...

    def renamed(a: int, x: int = 1, *, c: int = 2) -> None: ...

    def keyword_only(*, a: int, b: int = 1, c: int = 2) -> None: ...

    def extra_required(a: int, b: int = 1, *, c: int = 2, d: int) -> None: ...

    def with_kwargs(a: int, **kwargs: Any) -> None: ...

    theirs = [["a", "POSITIONAL_OR_KEYWORD", False], ["b", "POSITIONAL_OR_KEYWORD", True], ["c", "KEYWORD_ONLY", True]]
    assert incompatibilities("x", theirs, same) == []
    assert any("'b'" in p for p in incompatibilities("x", theirs, renamed))
    assert any("position 0" in p for p in incompatibilities("x", theirs, keyword_only))
    assert any("'d'" in p for p in incompatibilities("x", theirs, extra_required))
    assert any("position 1" in p for p in incompatibilities("x", theirs, with_kwargs))
    assert (
        incompatibilities("x", [["a", "POSITIONAL_OR_KEYWORD", False], ["k", "KEYWORD_ONLY", True]], with_kwargs) == []
    )


@pytest.mark.compat
@pytest.mark.timeout(180)
def test_snapshot_matches_the_installed_lightning() -> None:
    python = lightning_python()
    if python is None:
        pytest.skip("no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)")
    done = run_python([str(DUMPER)], python=python, env=base_env(), timeout=150)
    assert done.returncode == 0, done.output
    live = json.loads(done.stdout)
    assert live == REFERENCE, (
        f"tests/data/lightning_fabric_surface.json differs from what Lightning Fabric {live['version']} prints: "
        f"refresh it with `.venv-lightning/bin/python {DUMPER.relative_to(REPO)} > {SNAPSHOT.relative_to(REPO)}`"
    )
