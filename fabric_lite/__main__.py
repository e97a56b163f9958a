"""``python -m fabric_lite run ...``: the ``fabric-lite`` command without the console script."""

from fabric_lite.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
