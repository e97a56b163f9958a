"""Run litgpt commands one after another in one interpreter, each as ``python -m litgpt ARGS`` runs it: litgpt's own
``litgpt.__main__.main()`` with ``sys.argv`` set; then print an MD5 of every tensor of every checkpoint the commands
wrote. Used by the litgpt tier (tests/tiers/litgpt/test_litgpt.py), in ``.venv-litgpt``::

    python -m tests.helpers.litgpt.commands FOLDER STEPS_JSON
    python -m tests.helpers.litgpt.commands digest PATH...     # one DIGEST line: a list, one entry per file

``STEPS_JSON`` is a list of steps, run in ``FOLDER``: ``["tiny"]`` writes the tiny model, tokenizer and data
(:func:`tests.helpers.litgpt.tiny.make`), ``["copy", SRC, DST]`` copies a folder, ``["litgpt", NAME, ARGS]`` runs
``litgpt ARGS``. Before each command's own output, stdout gets a line ``<<< litgpt NAME >>>`` (:func:`split` cuts
the output there); at the end, one ``DIGESTS {json}`` line: for each checkpoint file under ``FOLDER/out``, its
tensors by key (:func:`digest`). A command that fails ends the run with its traceback and exit code 1.

A start of Python with torch, Lightning and litgpt costs about 6 s of CPU, and the tier runs nine commands on each
library: one interpreter for all of them keeps what is compared (the printed lines, the files, the tensors) and
drops that cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

MARK = "<<< litgpt {} >>>"
#: the files of litgpt's output that hold tensors: checkpoints, LoRA and adapter weights
TENSOR_SUFFIXES = (".pth", ".lora", ".adapter", ".adapter_v2")


def holds_tensors(name: str) -> bool:
    return name.endswith(TENSOR_SUFFIXES) or ".pth." in name


def digest(obj: Any, key: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """Every tensor in ``obj`` (nested dicts, lists, tuples) by its key path: shape, dtype and an MD5 of its bytes;
    any other value by its ``repr``."""
    import torch

    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        data = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[key] = f"{tuple(obj.shape)} {obj.dtype} " + hashlib.md5(data).hexdigest()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            digest(v, f"{key}/{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            digest(v, f"{key}/{i}", out)
    else:
        out[key] = repr(obj)
    return out


def split(stdout: str) -> dict[str, str]:
    """What each command printed, by its name, from the output of a run."""
    head, *_ = MARK.split("{}")
    found = {}
    for chunk in stdout.split(head)[1:]:
        name, _, text = chunk.partition(" >>>\n")
        found[name] = text.split("\nDIGESTS ", 1)[0] + ("\n" if "\nDIGESTS " in text else "")
    return found


def _litgpt(args: list[str]) -> None:
    from litgpt.__main__ import main

    sys.argv = ["litgpt", *args]
    try:
        main()
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


def _load_and_digest(path: Path) -> dict[str, str]:
    import torch

    return digest(torch.load(path, map_location="cpu", weights_only=True))


def main() -> int:
    if sys.argv[1] == "digest":
        print("DIGEST " + json.dumps([_load_and_digest(Path(path)) for path in sys.argv[2:]]))
        return 0
    folder, steps = Path(sys.argv[1]), json.loads(sys.argv[2])
    os.chdir(folder)
    for step in steps:
        kind, *rest = step
        if kind == "tiny":
            from tests.helpers.litgpt.tiny import make

            make(folder)
        elif kind == "copy":
            shutil.copytree(folder / rest[0], folder / rest[1])
        else:
            name, args = rest
            print(MARK.format(name), flush=True)
            try:
                _litgpt(args)
            except BaseException:
                sys.stdout.flush()
                print(f"litgpt {' '.join(args)} failed", file=sys.stderr)
                traceback.print_exc()
                return 1
            sys.stdout.flush()
    out = folder / "out"
    digests = {
        str(path.relative_to(out)): _load_and_digest(path)
        for path in sorted(out.rglob("*"))
        if path.is_file() and holds_tensors(path.name)
    }
    print("DIGESTS " + json.dumps(digests), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
