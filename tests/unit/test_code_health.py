"""Code health, part of the test command CI runs: ``mypy --strict`` on the package, ``ruff`` lint and format check,
and no import circle among the package's modules.

Both tools come with the ``test`` extra (``.ci/setup`` installs it); a venv without them fails here, saying how to
install them, rather than skipping.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ["fabric_lite", "tests", "examples", "benchmarks", "docs"]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed in this venv: run .ci/setup (it installs the `test` extra).")
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_mypy_strict_is_clean():
    done = _run([_tool("mypy")])  # strict, on fabric_lite/ (pyproject's [tool.mypy])
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_lint_is_clean():
    done = _run([_tool("ruff"), "check", *CHECKED])
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    done = _run([_tool("ruff"), "format", "--check", *CHECKED])
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------- import circles
def module_imports(package: Path) -> dict[str, set[str]]:
    """``{module: the package's modules it imports}`` for every module of ``package``, read from the source
    (nothing is imported). Imports inside functions count (an import put off until a call still runs upward when it
    names a module above); only those under ``if TYPE_CHECKING:``, which never run, do not. ``from a.b import c``
    imports ``a.b.c`` when that is a module, else ``a.b`` (its ``__init__``)."""
    root = package.name
    files = {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for statement in _imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(statement, ast.Import):
                found.update(alias.name for alias in statement.names if alias.name in files)
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:  # relative: from the module's package, one level up per extra dot
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - statement.level + 1]
                    base = ".".join(parts + ([statement.module] if statement.module else []))
                if base.split(".")[0] != root:
                    continue
                for alias in statement.names:
                    target = f"{base}.{alias.name}"
                    found.add(target if target in files else base)
        graph[name] = {target for target in found if target in files and target != name}
    return graph


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``nodes``, nested ones included (in functions, classes, loops, ``try``, ``match``),
    but those under ``if TYPE_CHECKING:``, which never run."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse)
        else:
            yield from _imports(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of ``graph``, as the modules of one circle in import order (its first module repeated at the
    end): one per strongly connected component of more than one module, found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_one_circle(graph, set(component)) for component in components]


def _one_circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path through ``component`` from its first module back to it (breadth first: the shortest)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module] & component):
            if target == start:
                return [*paths[module], start]
            if target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise AssertionError(f"{sorted(component)} is no circle")  # a strongly connected component always has one


def test_fabric_lite_has_no_import_circle() -> None:
    """Imports run downward: no module of fabric_lite imports one that imports it back, at import time or inside a
    function (the checkpoint circle of 71d4fc6, ``strategy -> _fsdp_checkpoint -> _dcp -> _deepspeed_checkpoint ->
    strategy``, ran through imports inside functions)."""
    circles = import_circles(module_imports(REPO / "fabric_lite"))
    assert not circles, "import circles in fabric_lite:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle(tmp_path: Path) -> None:
    """The check itself, on a package with one circle (``a -> b -> c.d -> a``, its last step an import inside a
    function) beside imports that do not close one: a function-level import, a ``TYPE_CHECKING`` import, and a
    relative import of a sibling."""
    package = tmp_path / "pkg"
    (package / "c").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "import pkg.c.d\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n",
        "c/__init__.py": "",
        "c/d.py": "from . import f\n\ndef h():\n    from pkg.a import x\n",
        "c/f.py": "",
        "e.py": "import pkg.b\n\ndef g():\n    from pkg import a\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = module_imports(package)
    assert graph["pkg.c.d"] == {"pkg.a", "pkg.c.f"} and graph["pkg.b"] == {"pkg.c.d"}
    assert graph["pkg.e"] == {"pkg.a", "pkg.b"}
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.c.d", "pkg.a"]]


#: the launchers and strategies (and the runtime they hand the run to) talk through methods and a RunContext
_NO_REACHING_IN = ["fabric_lite/strategies", "fabric_lite/runtime", "fabric_lite/cli.py"]


def private_attribute_writes(paths: Iterable[Path], root: Path) -> list[str]:
    """``file:line: target`` for every write to another object's private attribute in ``paths`` (named relative to
    ``root``): an assignment (plain, augmented, annotated, or inside a tuple target), a ``del`` or a ``setattr`` with
    a ``_name``, on anything but ``self`` or ``cls``. Dunder names (``__class__``...) are the language's."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            written = [target for target in _written(node) if isinstance(target, ast.Attribute)]
            names = [(target.value, target.attr, ast.unparse(target)) for target in written]
            if _is_setattr(node):
                names.append((node.args[0], str(node.args[1].value), ast.unparse(node)))  # type: ignore[attr-defined]
            for owner, attribute, text in names:
                private = attribute.startswith("_") and not attribute.startswith("__")
                own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                if private and not own:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    return found


def _is_setattr(node: ast.AST) -> bool:
    """A ``setattr(obj, "name", value)`` call with the name spelled out."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"):
        return False
    return len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)


def _written(node: ast.AST) -> list[ast.expr]:
    """The targets that ``node`` assigns or deletes, tuple targets unpacked."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        pending = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        pending = [node.target]
    else:
        return []
    targets = []
    while pending:
        target = pending.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            pending.extend(target.elts)
        elif isinstance(target, ast.Starred):
            pending.append(target.value)
        else:
            targets.append(target)
    return targets


def test_no_launcher_or_strategy_sets_another_objects_private_attribute() -> None:
    """A launcher hands the strategy a ``RunContext`` (``strategy.attach_run``), and a strategy runs the precision's
    hooks in its ``backward_context()``: none of them writes another object's private state."""
    files: list[Path] = []
    for name in _NO_REACHING_IN:
        path = REPO / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    found = private_attribute_writes(files, REPO)
    assert not found, "private attributes of another object written:\n" + "\n".join(found)


def test_the_private_write_check_finds_each_kind_of_write(tmp_path: Path) -> None:
    source = tmp_path / "launcher.py"
    source.write_text(
        "def launch(self, strategy, other):\n"
        "    strategy._run_dir, strategy._kind = 'a', 'b'\n"
        "    other.inner._count += 1\n"
        "    setattr(strategy, '_store', None)\n"
        "    del other._cache\n"
        "    self._own = 1\n"
        "    setattr(self, '_also_own', 1)\n"
        "    strategy.public = 1\n"
        "    strategy.__class__ = object\n"
        "    x: int = 0\n"
    )
    found = sorted(line.split(":", 1)[1] for line in private_attribute_writes([source], tmp_path))
    assert found == sorted(
        [
            "2: strategy._run_dir",
            "2: strategy._kind",
            "3: other.inner._count",
            "4: setattr(strategy, '_store', None)",
            "5: other._cache",
        ]
    )
