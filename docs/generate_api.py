"""Generate ``docs/api.md``, the API reference, from fabric_lite's docstrings.

Walks the public modules in ``MODULES`` (their ``__all__``, or else the public classes and functions they define)
and writes, for each class, its signature, docstring, properties, public attributes and public methods, and for
each function its signature and docstring. Google-style sections (``Args:``, ``Raises:``) become Markdown lists
and reST literal blocks (``Example::``) fenced code blocks. Only the standard library is used and only
fabric_lite's own modules are imported (none imports an optional package when imported), so the reference builds
wherever fabric_lite imports.

Usage::

    python docs/generate_api.py                      # rewrite docs/api.md
    python docs/generate_api.py --check              # exit 1, with a diff, when docs/api.md is out of date
    python docs/generate_api.py --missing-examples   # list the items whose docstring shows no example

``tests/unit/test_docs.py`` fails when ``docs/api.md`` is out of date, or when an item lacks an example.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

API_MD = Path(__file__).resolve().parent / "api.md"

#: the public modules, in the order the reference shows them
MODULES = (
    "fabric_lite",
    "fabric_lite.strategies",
    "fabric_lite.strategies.launchers",
    "fabric_lite.accelerators",
    "fabric_lite.plugins",
    "fabric_lite.plugins.environments",
    "fabric_lite.plugins.precision",
    "fabric_lite.plugins.io",
    "fabric_lite.plugins.collectives",
    "fabric_lite.loggers",
    "fabric_lite.utilities",
    "fabric_lite.utilities.distributed",
    "fabric_lite.utilities.rank_zero",
    "fabric_lite.utilities.throughput",
    "fabric_lite.utilities.spike",
    "fabric_lite.utilities.data",
    "fabric_lite.utilities.seed",
    "fabric_lite.utilities.apply_func",
    "fabric_lite.utilities.types",
    "fabric_lite.utilities.cloud_io",
    "fabric_lite.utilities.warnings",
    "fabric_lite.utilities.enums",
    "fabric_lite.utilities.consolidate",
    "fabric_lite.cli",
    "fabric_lite.as_lightning",
)

#: Google-style sections (a line ``Name:`` alone): bodies of ``name: description`` entries, of text, of code
ENTRY_SECTIONS = ("Args", "Arguments", "Parameters", "Keyword Args", "Keyword Arguments", "Raises", "Attributes")
TEXT_SECTIONS = ("Returns", "Return", "Yields", "Note", "Notes", "Warning", "Warnings", "See Also", "References")
EXAMPLE_SECTIONS = ("Example", "Examples")
_SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]*?)\s*::?\s*$")
_EXAMPLE_HEADER = re.compile(r"^\s*Examples?\s*::?\s*$", re.MULTILINE)
_SHELL_START = ("$ ", "#!", "fabric-lite ", "torchrun ", "srun ", "sbatch ", "salloc ", "python ", "pip ", "export ")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


# ---------------------------------------------------------------------------------------------- what is documented
@dataclasses.dataclass
class Item:
    """One documented object: a module member, or a member of a documented class."""

    qualname: str  # where it is documented, e.g. "fabric_lite.Fabric.launch"
    kind: str  # "class", "function", "alias", "data", "method", "property" or "attribute"
    obj: Any  # for a method: the raw class attribute (staticmethod/classmethod objects kept)
    doc: str | None
    #: the docstring must show an example (public functions and classes, and Fabric's public methods)
    needs_example: bool = False
    members: list[Item] = dataclasses.field(default_factory=list)
    #: a class's members defined in documented base classes: base qualname -> names
    inherited: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: an alias's documented name
    target: str = ""


@dataclasses.dataclass
class Module:
    module: ModuleType
    items: list[Item]


def has_example(doc: str | None) -> bool:
    """Whether a docstring shows an example: an ``Example``/``Examples`` section, a ``>>>`` line, or a code block
    (fenced, or a reST literal block: a line ending in ``::`` followed by a more indented, non-empty block)."""
    if not doc:
        return False
    if _EXAMPLE_HEADER.search(doc) or ">>>" in doc or "```" in doc:
        return True
    lines = doc.expandtabs().splitlines()
    for index, line in enumerate(lines):
        if line.rstrip().endswith("::"):
            following = next((text for text in lines[index + 1 :] if text.strip()), "")
            if len(following) - len(following.lstrip()) > len(line) - len(line.lstrip()):
                return True
    return False


def public_names(module: ModuleType) -> list[str]:
    """``__all__``, or else the public classes and functions the module itself defines, in source order."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module.__name__
    ]


def _own(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] == "fabric_lite"


def _unwrap(value: Any) -> Any:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _is_public_member(name: str, value: Any) -> bool:
    return not name.startswith("_") and (not inspect.isclass(value) or _own(value))


def _comment_docs(lines: list[str], names: set[str]) -> dict[str, str]:
    """The ``#:`` comments right above the assignments to ``names`` (Sphinx's convention for attributes)."""
    found: dict[str, str] = {}
    assignment = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*[:=]")
    for index, line in enumerate(lines):
        match = assignment.match(line)
        if not match or match.group("name") not in names or match.group("name") in found:
            continue
        comments: list[str] = []
        above = index - 1
        while above >= 0 and lines[above].startswith("#:"):
            comments.insert(0, lines[above][2:].strip())
            above -= 1
        if comments:
            found[match.group("name")] = " ".join(comments)
    return found


def _class_attribute_docs(cls: type) -> dict[str, str]:
    """``#:`` comments of the attributes assigned in the class body itself (not in nested definitions)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    if not tree.body or not isinstance(tree.body[0], ast.ClassDef):
        return {}
    lines = source.splitlines()
    body = tree.body[0].body
    indent = body[0].col_offset if body else 4
    # the class body's own lines, dedented; lines of nested blocks are blanked so that they cannot match
    own = [line[indent:] if line[:indent].strip() == "" and line[indent : indent + 1] != " " else "" for line in lines]
    names = {
        target.id
        for node in body
        for target in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
        if isinstance(target, ast.Name)
    }
    return _comment_docs(own, names)


def _members(cls: type, qualname: str, documented: dict[type, str]) -> tuple[list[Item], dict[str, list[str]]]:
    """The public members to document with ``cls``: its own, and those of fabric_lite base classes that the
    reference does not document (private ones); the members of documented bases are listed as inherited."""
    items: list[Item] = []
    inherited: dict[str, list[str]] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not _own(klass):
            continue
        fields = [f for f in dataclasses.fields(klass) if f.name not in seen] if dataclasses.is_dataclass(klass) else []
        fields = [f for f in fields if not f.name.startswith("_")]
        names = {f.name for f in fields}
        public = [n for n, raw in vars(klass).items() if n not in seen | names and _is_public_member(n, raw)]
        seen.update(public, names)
        if klass is not cls and klass in documented:
            if public or fields:
                inherited[documented[klass]] = [f.name for f in fields] + public
            continue
        attribute_docs = _class_attribute_docs(klass)
        for spec in fields:
            default = "" if spec.default is dataclasses.MISSING else f" = {_default(spec.default).text}"
            shown = f"{spec.name}: {spec.type}{default}"
            items.append(Item(f"{qualname}.{spec.name}", "attribute", shown, attribute_docs.get(spec.name)))
        for name in public:
            raw = vars(klass)[name]
            member = f"{qualname}.{name}"
            if isinstance(raw, property):
                items.append(Item(member, "property", raw, raw.fget.__doc__ if raw.fget else None))
            elif callable(_unwrap(raw)):
                fabric_method = qualname == "fabric_lite.Fabric"
                items.append(Item(member, "method", raw, _unwrap(raw).__doc__, needs_example=fabric_method))
            else:
                items.append(Item(member, "attribute", f"{name} = {_default(raw).text}", attribute_docs.get(name)))
    return items, inherited


def documented_classes() -> dict[type, str]:
    """Every public class of the reference, with the name it is documented under (the first module exporting it)."""
    where: dict[type, str] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            value = getattr(module, name)
            if inspect.isclass(value) and value not in where:
                where[value] = f"{module_name}.{name}"
    return where


def collect() -> list[Module]:
    """Every public module with its items; an object that several modules export is documented under the first."""
    documented = documented_classes()
    home: dict[int, str] = {}
    result: list[Module] = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        names = public_names(module)
        try:
            data_docs = _comment_docs(inspect.getsource(module).splitlines(), set(names))
        except OSError:
            data_docs = {}
        items: list[Item] = []
        for name in names:
            value = getattr(module, name)
            qualname = f"{module_name}.{name}"
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                items.append(Item(qualname, "data", value, data_docs.get(name)))
            elif id(value) in home:
                items.append(Item(qualname, "alias", value, None, target=home[id(value)]))
            elif inspect.isclass(value):
                home[id(value)] = qualname
                members, inherited = _members(value, qualname, documented)
                items.append(Item(qualname, "class", value, value.__doc__, True, members, inherited))
            else:
                home[id(value)] = qualname
                items.append(Item(qualname, "function", value, value.__doc__, needs_example=True))
        result.append(Module(module, items))
    return result


def walk(tree: list[Module]) -> Iterator[Item]:
    for module in tree:
        for item in module.items:
            yield item
            yield from item.members


def missing_examples(tree: list[Module] | None = None) -> list[str]:
    """The items whose docstring must show an example and does not (qualified names)."""
    return [item.qualname for item in walk(tree or collect()) if item.needs_example and not has_example(item.doc)]


# ---------------------------------------------------------------------------------------------- docstrings
def _inline(text: str) -> str:
    """reST inline markup as Markdown: ``code`` and :role:`target` become `code`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _fence(lines: list[str]) -> list[str]:
    body = textwrap.dedent("\n".join(lines)).strip("\n").splitlines()
    first = next((line.strip() for line in body if line.strip()), "")
    language = "bash" if first.startswith(_SHELL_START) else "pycon" if first.startswith(">>>") else "python"
    language = "text" if first.startswith("epoch ") else language
    return [f"```{language}", *body, "```"]


def _block(lines: list[str], start: int) -> tuple[list[str], int]:
    """The indented block (with the blank lines inside it) that starts at ``start``, and the index after it."""
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end], end


_ENTRY = re.compile(r"^(?P<names>[*\w][\w*, ]*?)\s*(?P<type>\([^)]*\))?:\s+(?P<text>.*)$")


def _entries(body: list[str]) -> list[str]:
    """``name: description`` entries (continuation lines indented deeper) as Markdown list items."""
    out: list[str] = []
    for line in textwrap.dedent("\n".join(body)).splitlines():
        if not line.strip():
            continue
        match = None if line.startswith(" ") else _ENTRY.match(line)
        if match:
            names = ", ".join(f"`{name.strip()}`" for name in match.group("names").split(","))
            typ = f" {match.group('type')}" if match.group("type") else ""
            out.append(f"- {names}{typ}: {_inline(match.group('text'))}")
        elif out:
            out[-1] += " " + _inline(line.strip())
        else:
            out.append(f"- {_inline(line.strip())}")
    return out


def docstring_to_markdown(doc: str | None) -> list[str]:
    """A Google-style docstring, with reST literal blocks, as Markdown lines."""
    if not doc:
        return ["*No docstring.*"]
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        section = _SECTION.match(line)
        if section and section.group("name") in ENTRY_SECTIONS + TEXT_SECTIONS + EXAMPLE_SECTIONS:
            name = section.group("name")
            body, i = _block(lines, i + 1)
            if name in EXAMPLE_SECTIONS:
                rendered = _fence(body)
            elif name in ENTRY_SECTIONS:
                rendered = _entries(body)
            else:
                rendered = [_inline(text) for text in textwrap.dedent("\n".join(body)).splitlines()]
            out += ["", f"**{name}:**", "", *rendered, ""]
            continue
        if line.rstrip().endswith("::") and not line.startswith(" "):
            # a paragraph that ends in "::" introduces a literal block
            head = line.rstrip()[:-2].rstrip()
            if head:
                out.append(_inline(head) + ":")
            start = i + 1
            while start < len(lines) and not lines[start].strip():
                start += 1
            body, i = _block(lines, start)
            if not body:  # cleandoc dedents a docstring whose only later lines are the block: take the paragraph
                while i < len(lines) and lines[i].strip():
                    body.append(lines[i])
                    i += 1
            if body:
                out += ["", *_fence(body), ""]
            continue
        previous = next((text for text in reversed(out) if text.strip()), "")
        continues_list = bool(out and out[-1].strip()) and (
            previous.lstrip().startswith(("* ", "- ")) or previous.startswith(" ")
        )
        if line.startswith("    ") and not continues_list:
            # an indented block that does not continue a list item: a literal block
            body, i = _block(lines, i)
            out += ["", *_fence(body), ""]
            continue
        out.append(_inline(line))
        i += 1
    while out and not out[-1]:
        out.pop()
    return out


# ---------------------------------------------------------------------------------------------- signatures
class _Shown:
    """Shows a string as it is (an annotation without quotes; a default without its memory address)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(value: Any) -> _Shown:
    if isinstance(value, ModuleType):  # its repr names the file, which depends on where the checkout is
        return _Shown(f"<module {value.__name__!r}>")
    return _Shown(_ADDRESS.sub("", repr(value)))


def signature(obj: Any, name: str, bound: bool = False) -> str | None:
    """``name(params) -> returns``, with string annotations unquoted and long signatures one parameter a line;
    ``bound`` leaves out the first parameter (a method's ``self``, a classmethod's ``cls``)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    if bound:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])

    def shown(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty:
            return annotation
        return _Shown(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))

    parameters = [
        p.replace(
            annotation=shown(p.annotation),
            default=p.default if p.default is inspect.Parameter.empty else _default(p.default),
        )
        for p in sig.parameters.values()
    ]
    sig = sig.replace(parameters=parameters, return_annotation=shown(sig.return_annotation))
    text = f"{name}{sig}"
    if len(text) <= 100:
        return text
    # one parameter a line: split the rendered parameter list at its top-level commas
    inner = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
    parts, depth, current = [], 0, ""
    for char in inner:
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    returns = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation!r}"
    return f"{name}(\n" + "".join(f"    {part},\n" for part in parts) + f"){returns}"


def _code(text: str | None) -> list[str]:
    return ["```python", text, "```", ""] if text else []


# ---------------------------------------------------------------------------------------------- rendering
def _anchor(qualname: str) -> str:
    return qualname.replace(".", "-").lower()


def _heading(level: int, qualname: str, title: str) -> list[str]:
    return [f'<a id="{_anchor(qualname)}"></a>', "", f"{'#' * level} {title}", ""]


def _summary(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    if not doc:
        return "*No docstring.*"
    return _inline(" ".join(inspect.cleandoc(doc).split("\n\n")[0].split()))


def _type_name(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _short(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


@dataclasses.dataclass
class Renderer:
    """Renders the collected items as Markdown; ``documented`` maps each public class to its documented name."""

    documented: dict[type, str]

    def render(self, tree: list[Module]) -> str:
        out = [
            "# API reference",
            "",
            "<!-- Generated from the docstrings by docs/generate_api.py: do not edit by hand. -->",
            "",
            "Generated from the docstrings by [`docs/generate_api.py`](generate_api.py): `python docs/generate_api.py`"
            " rewrites this file, and `tests/unit/test_docs.py` fails when it is out of date. Classes are shown with"
            " their constructor's signature; members inherited from another documented class are linked, not repeated.",
            "",
            "## Contents",
            "",
        ]
        for module in tree:
            names = ", ".join(
                f"[`{_short(item.qualname)}`](#{_anchor(item.qualname)})"
                for item in module.items
                if item.kind != "alias"
            )
            out.append(
                f"- [`{module.module.__name__}`](#{_anchor(module.module.__name__)})" + (f": {names}" * bool(names))
            )
        out.append("")
        for module in tree:
            out += _heading(2, module.module.__name__, f"`{module.module.__name__}`")
            out += [*docstring_to_markdown(module.module.__doc__), ""]
            for item in module.items:
                out += self.item(item)
        return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"

    def item(self, item: Item) -> list[str]:
        short = _short(item.qualname)
        if item.kind == "alias":
            return [f"`{item.qualname}` is [`{item.target}`](#{_anchor(item.target)}).", ""]
        if item.kind == "data":
            return self.data(item)
        if item.kind == "class":
            return self.klass(item)
        return [
            *_heading(3, item.qualname, f"`{short}()`"),
            *_code(signature(item.obj, short)),
            *docstring_to_markdown(item.doc),
            "",
        ]

    def data(self, item: Item) -> list[str]:
        short = _short(item.qualname)
        lines = _heading(3, item.qualname, f"`{short}`")
        value = item.obj
        if isinstance(value, dict) and len(repr(value)) > 100:
            lines += [f"A `{type(value).__name__}` of {len(value)} entries:", "", "| key | value |", "|---|---|"]
            for key, entry in value.items():
                if hasattr(entry, "class_name") and hasattr(entry, "description"):
                    shown = f"`{entry.class_name}`: {entry.description}"
                elif inspect.isclass(entry):
                    shown = f"`{entry.__name__}`"
                else:
                    shown = f"`{_default(entry).text}`"
                lines.append(f"| `{key!s}` | {shown} |")
            lines.append("")
        else:
            lines += _code(f"{short} = {_default(value).text}")
        if item.doc:
            lines += [_inline(item.doc), ""]
        return lines

    def klass(self, item: Item) -> list[str]:
        cls = item.obj
        short = _short(item.qualname)
        lines = [*_heading(3, item.qualname, f"class `{short}`"), *_code(signature(cls, short))]
        bases = [base for base in cls.__bases__ if base is not object]
        if bases:
            lines += ["Bases: " + ", ".join(f"`{_type_name(base)}`" for base in bases), ""]
        lines += [*docstring_to_markdown(item.doc), ""]
        properties = [m for m in item.members if m.kind == "property"]
        if properties:
            lines += ["**Properties:**", ""]
            for prop in properties:
                returns = signature(prop.obj.fget, "x") if prop.obj.fget else None
                annotation = f": {returns.split(' -> ', 1)[1]}" if returns and " -> " in returns else ""
                settable = " (settable)" if prop.obj.fset is not None else ""
                anchor = f'<a id="{_anchor(prop.qualname)}"></a>'
                summary = _summary(prop.doc) if prop.doc else self.inherited_property_doc(cls, _short(prop.qualname))
                lines.append(f"- {anchor}`{_short(prop.qualname)}{annotation}`{settable}: {summary}")
            lines.append("")
        attributes = [m for m in item.members if m.kind == "attribute"]
        if attributes:
            lines += ["**Attributes:**", ""]
            for attribute in attributes:
                doc = f": {_inline(attribute.doc)}" if attribute.doc else ""
                lines.append(f'- <a id="{_anchor(attribute.qualname)}"></a>`{attribute.obj}`{doc}')
            lines.append("")
        for base, names in item.inherited.items():
            links = ", ".join(f"[`{name}`](#{_anchor(base + '.' + name)})" for name in names)
            lines += [f"Inherited from [`{_short(base)}`](#{_anchor(base)}): {links}.", ""]
        for method in (m for m in item.members if m.kind == "method"):
            lines += self.method(method, cls)
        return lines

    def inherited_property_doc(self, cls: type, name: str) -> str:
        """The summary of the nearest base class property of that name that has a docstring."""
        for base in cls.__mro__[1:]:
            value = vars(base).get(name)
            if _own(base) and isinstance(value, property) and value.fget is not None and value.fget.__doc__:
                return f"{_summary(value.fget.__doc__)} (as in `{_short(self.documented.get(base, base.__name__))}`)"
        return _summary(None)

    def method(self, item: Item, cls: type) -> list[str]:
        name = _short(item.qualname)
        function = _unwrap(item.obj)
        marks = [
            mark
            for mark, applies in (
                ("staticmethod", isinstance(item.obj, staticmethod)),
                ("classmethod", isinstance(item.obj, classmethod)),
                ("abstract", getattr(function, "__isabstractmethod__", False)),
            )
            if applies
        ]
        owner = _short(item.qualname.rsplit(".", 1)[0])
        title = f"`{owner}.{name}()`" + (f" *({', '.join(marks)})*" if marks else "")
        lines = [
            *_heading(4, item.qualname, title),
            *_code(signature(function, name, bound=not isinstance(item.obj, staticmethod))),
        ]
        if item.doc:
            return [*lines, *docstring_to_markdown(item.doc), ""]
        # an override without a docstring keeps the contract of the method it overrides
        base = next((b for b in cls.__mro__[1:] if name in vars(b) and _unwrap(vars(b)[name]).__doc__), None)
        if base is None:
            return [*lines, "*No docstring.*", ""]
        where = self.documented.get(base)
        if where:
            return [*lines, f"Overrides [`{_short(where)}.{name}`](#{_anchor(where + '.' + name)}).", ""]
        if not _own(base):  # a hook of a torch class (e.g. autograd.Function.forward): torch documents it
            return [*lines, f"Implements `{name}` of `{_type_name(cls.__mro__[1])}`.", ""]
        inherited_doc = _unwrap(vars(base)[name]).__doc__
        return [*lines, f"Overrides `{_type_name(base)}.{name}`:", "", *docstring_to_markdown(inherited_doc), ""]


def generate() -> str:
    """The reference, as the text of ``docs/api.md``."""
    return Renderer(documented_classes()).render(collect())


# ---------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/api.md from fabric_lite's docstrings.")
    parser.add_argument("--out", type=Path, default=API_MD, help="the file to write (default: docs/api.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out is out of date")
    parser.add_argument("--missing-examples", action="store_true", help="list the items that show no example")
    args = parser.parse_args(argv)
    if args.missing_examples:
        missing = missing_examples()
        print("\n".join(missing) if missing else "every public function and class shows an example")
        return 1 if missing else 0
    text = generate()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current == text:
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(args.out), "generated", lineterm="")
        print("\n".join(list(diff)[:200]))
        print(f"{args.out} is out of date: run python docs/generate_api.py", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
