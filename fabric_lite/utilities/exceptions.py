"""Exception types raised by fabric_lite.

fabric_lite raises the builtin classes (``ValueError``, ``TypeError``, ``RuntimeError``) that Lightning Fabric raises
for the same misuse. Where Lightning's class is an accident of its implementation, fabric_lite's class derives from
both the right class and Lightning's, so ``except`` clauses written for either keep working.
"""

from __future__ import annotations


class MisconfigurationException(ValueError):
    """A setting that cannot work on this machine or with the other settings (e.g. a GPU index that does not exist).

    Example::

        Fabric(accelerator="cuda", devices=[0, 3])  # on a machine with 2 GPUs
        # MisconfigurationException: Fabric(devices=[0, 3]) for accelerator='cuda': You requested gpu: [0, 3]
        #  But your machine only has: [0, 1] ([3] missing). Use devices=2 or indices from that list.
    """


class InvalidReduceOpError(ValueError, AttributeError):
    """An unknown ``reduce_op``.

    A ``ValueError``; also an ``AttributeError`` because that is what Lightning Fabric raises for the same input.
    """


class MissingEnvironmentVariableError(KeyError, RuntimeError):
    """A cluster environment was asked for a value whose environment variable is not set.

    A ``KeyError``, as Lightning Fabric raises for the same call, and a ``RuntimeError``; unlike a plain ``KeyError``
    its message reads as a sentence.

    Example::

        SLURMEnvironment(env={}).world_size()
        # MissingEnvironmentVariableError: The environment variable SLURM_NTASKS is not set, but SLURMEnvironment
        # needs it. Start the script with the launcher that sets it, or set SLURM_NTASKS yourself.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
