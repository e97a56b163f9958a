"""The mark ``fabric-lite run`` leaves in the environment of every process it starts (Lightning's ``LT_CLI_USED``);
a module of its own because ``fabric_lite.fabric`` reads it and must not import ``fabric_lite._run_script``."""

from __future__ import annotations

from collections.abc import Mapping

#: set to "1" by ``fabric-lite run`` for every process it starts (and inherited by their children)
CLI_USED_ENV_VAR = "LT_CLI_USED"


def launched_by_cli(env: Mapping[str, str]) -> bool:
    """Whether ``env`` (e.g. ``os.environ``) says ``fabric-lite run`` (or ``fabric run``) started the process."""
    return env.get(CLI_USED_ENV_VAR, "0").strip() not in ("", "0")
