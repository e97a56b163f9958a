"""Run a user's script (or module) as ``__main__`` in a worker of ``fabric-lite run``, exactly as ``python SCRIPT``
(or ``python -m MODULE``) would, inside torch's error recorder, so that torchrun's root-cause report shows the
failing rank's traceback rather than only an exit code."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Run ``sys.argv[1]`` (or the module after ``-m``) with the arguments that follow it, as in
    ``python -m fabric_lite._run_script train.py --lr 0.1``."""
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        raise SystemExit("usage: python -m fabric_lite._run_script (SCRIPT | -m MODULE) [ARGS...]")
    # imported here: this module is light to import, torch's elastic package is not
    from torch.distributed.elastic.multiprocessing.errors import record

    if sys.argv[1] == "-m":
        module = sys.argv[2]
        sys.argv = [module, *sys.argv[3:]]  # runpy puts the module's file in sys.argv[0]
        # `python -m MODULE` keeps the working directory first on sys.path, as `python -m` put it there for us
        record(runpy.run_module)(module, run_name="__main__", alter_sys=True)
        return
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # `python -m` put the working directory first on sys.path; `python script.py` puts the script's folder there
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    record(runpy.run_path)(script, run_name="__main__")


if __name__ == "__main__":
    main()
