"""``python -m fabric_lite.as_lightning``: run a program as ``python`` would, with the hook on in it and every Python
process it starts::

    python -m fabric_lite.as_lightning (-m MODULE | -c CODE | SCRIPT) [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys

from fabric_lite.as_lightning import install

_USAGE = (
    "usage: python -m fabric_lite.as_lightning (-m MODULE | -c CODE | SCRIPT) [ARGS...]\n"
    "Runs the program with lightning.fabric, lightning_fabric and lightning.Fabric served by fabric_lite\n"
    "(e.g. python -m fabric_lite.as_lightning -m litgpt pretrain --help)."
)


def main(argv: list[str]) -> None:
    """Run the program that ``argv`` (``sys.argv[1:]``) names, with the hook on.

    Example::

        main(["-m", "litgpt", "pretrain", "--help"])
    """
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    install()
    first = argv[0]
    if first in ("-m", "-c"):
        if len(argv) < 2:
            raise SystemExit(f"python -m fabric_lite.as_lightning: {first} needs an argument\n{_USAGE}")
        if first == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in sys.argv[0]
            sys.path[0] = os.getcwd()  # as `python -m` does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(first))  # `python script.py` puts the script's folder first
    runpy.run_path(first, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
