"""Run a user's script (or module) as ``__main__`` in a process started by ``fabric-lite run``.

``fabric-lite run`` starts every worker as ``python -m fabric_lite._run_script SCRIPT ARGS...`` (or
``... -m MODULE ARGS...``). This module runs ``SCRIPT`` exactly as ``python SCRIPT ARGS...`` would
(``__name__ == "__main__"``, ``sys.argv``, the script's folder first on ``sys.path``; a module as
``python -m MODULE ARGS...`` would), inside torch's error recorder: an exception that ends the script is
written to the file torchrun's agent reads, so the agent's root-cause report shows the failing rank's
exception and traceback instead of only an exit code.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Run ``sys.argv[1]`` (or the module after ``-m``) with the arguments that follow it.

    Example::

        python -m fabric_lite._run_script train.py --lr 0.1   # what each worker of `fabric-lite run` runs
        python -m fabric_lite._run_script -m litgpt pretrain  # with `fabric-lite run -m litgpt pretrain`
    """
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
