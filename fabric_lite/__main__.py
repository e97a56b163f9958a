"""``python -m fabric_lite run ...``: the ``fabric-lite`` command without the console script.

Example::

    python -m fabric_lite run --accelerator cpu --devices 2 train.py
"""

from fabric_lite.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
