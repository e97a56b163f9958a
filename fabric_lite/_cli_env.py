"""The mark ``fabric-lite run`` leaves in the environment of every process it starts: Lightning's ``LT_CLI_USED``,
under Lightning's name, so that a script started by either library's command line knows it.

``Fabric()`` in such a process joins the process group at once, so the script needs no ``fabric.launch()``. A
module of its own: ``fabric_lite.fabric`` reads it, and must not import ``fabric_lite._run_script`` (which runs as
``python -m`` and warns when it was imported before).
"""

from __future__ import annotations

from collections.abc import Mapping

#: set to "1" by ``fabric-lite run`` for every process it starts (and inherited by their children)
CLI_USED_ENV_VAR = "LT_CLI_USED"


def launched_by_cli(env: Mapping[str, str]) -> bool:
    """Whether ``env`` (the environment of this process) says ``fabric-lite run`` started the process.

    Example::

        launched_by_cli(os.environ)  # True in a script started by `fabric-lite run`, else False
    """
    return env.get(CLI_USED_ENV_VAR, "0").strip() not in ("", "0")
