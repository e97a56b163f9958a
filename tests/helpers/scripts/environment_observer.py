"""Print what a cluster environment class reports for each of a list of environment mappings, as JSON.

    python tests/helpers/scripts/environment_observer.py fabric_lite cases.json     # fabric_lite's classes
    <lightning venv>/bin/python tests/helpers/scripts/environment_observer.py lightning cases.json

``cases.json`` is a list of ``{"cls": "LSFEnvironment", "env": {...}}``. For each case ``os.environ`` is replaced
by ``env`` (Lightning's classes read it; fabric_lite's get it as ``env=`` too), the class is created and every
getter is read. A value that raises is reported as ``"error"`` (the exception types differ between the two on
purpose: fabric_lite raises ValueError/RuntimeError naming the variable, Lightning often a bare KeyError).
The output is one line: ``OBS <json list>``, one entry per case.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

GETTERS = ("creates_processes_externally", "main_address", "main_port", "world_size", "global_rank")
GETTERS += ("local_rank", "node_rank")


def read(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except NotImplementedError:
        return "NotImplementedError"
    except Exception:
        return "error"


def observe(impl: str, cls_name: str, env: dict[str, str]) -> dict[str, Any]:
    package = "lightning_fabric" if impl == "lightning" else "fabric_lite"
    module = importlib.import_module(f"{package}.plugins.environments")
    cls = getattr(module, cls_name)
    os.environ.clear()
    os.environ.update(env)
    row: dict[str, Any] = {"detect": read(cls.detect if impl == "lightning" else lambda: cls.detect(env))}
    try:
        environment = cls() if impl == "lightning" else cls(env=env)
    except Exception:
        row["construct"] = "error"
        return row
    row["construct"] = "ok"
    for name in GETTERS:
        attr = getattr(type(environment), name)
        if isinstance(attr, property):
            row[name] = read(lambda: getattr(environment, name))
        else:
            row[name] = read(getattr(environment, name))
    return row


def main() -> None:
    impl, path = sys.argv[1], sys.argv[2]
    with open(path) as handle:
        cases = json.load(handle)
    saved = dict(os.environ)
    rows = [observe(impl, case["cls"], case["env"]) for case in cases]
    os.environ.clear()
    os.environ.update(saved)
    os.write(1, ("OBS " + json.dumps(rows) + "\n").encode())


if __name__ == "__main__":
    main()
