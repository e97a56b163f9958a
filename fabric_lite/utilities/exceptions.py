"""Exception types raised by fabric_lite.

Where Lightning Fabric's class for a misuse is an accident of its code, fabric_lite's derives from both the right
builtin and Lightning's, so ``except`` clauses for either keep working.
"""

from __future__ import annotations


class MisconfigurationException(ValueError):
    """A setting that cannot work on this machine or with the other settings.

    Example::

        Fabric(accelerator="cuda", devices=[0, 3])  # with 2 GPUs: MisconfigurationException: ... [3] missing
    """


class InvalidReduceOpError(ValueError, AttributeError):
    """An unknown ``reduce_op``: a ``ValueError``, and an ``AttributeError`` as Lightning Fabric raises."""


class MissingEnvironmentVariableError(KeyError, RuntimeError):
    """An environment variable a cluster environment needs is unset: a ``KeyError`` (as in Lightning Fabric) and a
    ``RuntimeError``, whose message reads as a sentence.

    Example::

        SLURMEnvironment(env={}).world_size()  # MissingEnvironmentVariableError: ... SLURM_NTASKS is not set ...
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
