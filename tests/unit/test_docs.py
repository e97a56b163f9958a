"""The documentation stays true: ``docs/api.md`` is what ``docs/generate_api.py`` makes of the docstrings today,
every public class and function (and every public method of ``Fabric``) shows an example, and every link in the
documentation leads somewhere."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.harness import REPO, base_env, run_python

DOCS = REPO / "docs"
OPTIONAL_PACKAGES = ("deepspeed", "horovod", "tensorboard", "tensorboardX", "tqdm")

# runs the generator with the optional packages made unimportable: the reference must not need them
GENERATE_WITHOUT_OPTIONAL = r"""
import importlib.abc, runpy, sys
blocked = {blocked!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by tests/unit/test_docs.py)", name=name)
        return None

sys.meta_path.insert(0, Block())
sys.argv = ["generate_api.py", "--out", {out!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_api", DOCS / "generate_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_api"] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return _generator()


@pytest.mark.timeout(180)
def test_api_reference_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "api.md"
    code = GENERATE_WITHOUT_OPTIONAL.format(
        blocked=OPTIONAL_PACKAGES, out=str(out), script=str(DOCS / "generate_api.py")
    )
    done = run_python(["-c", code], env=base_env(), timeout=150)
    assert done.returncode == 0, f"the generator failed without {OPTIONAL_PACKAGES}:\n{done.output}"
    generated = out.read_text()
    current = (DOCS / "api.md").read_text()
    if generated != current:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    current.splitlines(), generated.splitlines(), "docs/api.md", "generated", lineterm=""
                )
            )[:80]
        )
        pytest.fail(f"docs/api.md is out of date: run `.venv/bin/python docs/generate_api.py`.\n{diff}")


def test_every_public_item_shows_an_example(generator: ModuleType) -> None:
    missing = generator.missing_examples()
    assert not missing, (
        f"{len(missing)} public item(s) have no example in their docstring (an `Example::` section, a `>>>` line or"
        " a code block):\n  " + "\n  ".join(missing)
    )


def test_the_example_check_is_honest(generator: ModuleType) -> None:
    has_example = generator.has_example
    assert has_example("Do it.\n\nExample::\n\n    do_it()\n")
    assert has_example("Do it.\n\n    Examples:\n        >>> do_it()\n")
    assert has_example("Do it:\n\n>>> do_it()\n")
    assert has_example("Do it:\n\n```python\ndo_it()\n```\n")
    assert has_example("Do it like this::\n\n        do_it()\n    ")  # a reST literal block, as in the source
    assert not has_example(None)
    assert not has_example("")
    assert not has_example("Do it, for example with care.")
    assert not has_example("Do it.\n\n    Note::\n\n    An empty literal block.\n")
    assert not has_example("Write ``ns::name`` to name it.\n")
    assert not has_example("An example of good practice.\n\nArgs:\n    x: an example value.\n")


def test_the_reference_covers_every_public_name(generator: ModuleType) -> None:
    tree = generator.collect()
    documented = {item.qualname for item in generator.walk(tree)}
    for module_name in generator.MODULES:
        module = importlib.import_module(module_name)
        for name in generator.public_names(module):
            assert f"{module_name}.{name}" in documented, f"{module_name}.{name} is missing from the reference"
    from fabric_lite import Fabric

    for name, value in vars(Fabric).items():
        if not name.startswith("_"):
            assert f"fabric_lite.Fabric.{name}" in documented, f"Fabric.{name} is missing from the reference"
            doc = value.fget.__doc__ if isinstance(value, property) else inspect.getdoc(value)
            assert doc, f"Fabric.{name} has no docstring"


def test_docstrings_become_markdown(generator: ModuleType) -> None:
    doc = """Reduce ``x`` with :func:`sync_ddp`.

    Args:
        x: the tensor,
            on every rank.
        group, op: the group and
            the reduction.

    Returns:
        The result.

    Example::

        # rank 0: 1   rank 1: 3
        sync_ddp(x)  # 4
    """
    markdown = "\n".join(generator.docstring_to_markdown(doc))
    assert "Reduce `x` with `sync_ddp`." in markdown
    assert "- `x`: the tensor, on every rank." in markdown
    assert "- `group`, `op`: the group and the reduction." in markdown
    assert "**Returns:**\n\nThe result." in markdown
    assert "**Example:**\n\n```python\n# rank 0: 1   rank 1: 3\nsync_ddp(x)  # 4\n```" in markdown
    for run_it in ("Run it::\n\n    fabric-lite run train.py\n", "Run it::\n\n        fabric-lite run train.py\n    "):
        shell = "\n".join(generator.docstring_to_markdown(run_it))
        assert shell == "Run it:\n\n```bash\nfabric-lite run train.py\n```"


def test_signatures_are_readable(generator: ModuleType) -> None:
    def f(a: int, *, b: str | None = None) -> bool:  # annotations are strings here (__future__)
        return True

    assert generator.signature(f, "f") == "f(a: int, *, b: str | None = None) -> bool"
    assert generator.signature(lambda: None, "g") == "g()"
    marker = object()

    def h(x: object = marker) -> None: ...

    assert generator.signature(h, "h") == "h(x: object = <object object>) -> None"  # no memory address: stable


_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", [*sorted(p.name for p in DOCS.glob("*.md")), "../README.md"])
def test_links_lead_somewhere(page: str) -> None:
    path = (DOCS / page).resolve()
    text = path.read_text()
    broken = []
    for match in _LINK.finditer(text):
        target = match.group("target")
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(target)
            continue
        if anchor and destination.suffix == ".md" and not _has_anchor(destination.read_text(), anchor):
            broken.append(target)
    assert not broken, f"{page} links to missing files or anchors: {broken}"


def _has_anchor(text: str, anchor: str) -> bool:
    if f'<a id="{anchor}"></a>' in text:
        return True
    # GitHub's heading anchors: lower case, punctuation other than - and _ dropped, spaces as dashes
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        if slug == anchor:
            return True
    return False
