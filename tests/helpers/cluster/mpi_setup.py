"""Open MPI and mpi4py for the MPI tier (tests/tiers/mpi/test_mpi.py), installed by the tests themselves.

    python -m tests.helpers.cluster.mpi_setup      # install what is missing, print the PYTHONPATH entry holding mpi4py

* Open MPI: Debian's ``openmpi-bin`` and ``libopenmpi-dev`` with apt-get, when ``mpirun`` is missing (root only;
  about 10 s; ``apt-get update`` first only when the install cannot find the packages).
* mpi4py: installed with this interpreter's pip into ``.venv-mpi/site`` (``pip install --target``), a folder that
  the MPI jobs put on ``PYTHONPATH``. The project's ``.venv`` is left as it is, so everywhere else mpi4py stays
  absent, as for a user who did not install the ``mpi`` extra. mpi4py's wheel loads the system's ``libmpi``.

Both steps are idempotent and take nothing once done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.cluster.slurm_cluster import _first_error

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("openmpi-bin", "libopenmpi-dev")
#: where mpi4py goes (ignored by git: .venv-*/)
MPI4PY_TARGET = REPO / ".venv-mpi" / "site"
#: what mpirun needs to run here: as root (containers), more ranks than cores, TCP between local ranks (the
#: shared-memory transport's single-copy mechanism needs ptrace rights a container may not grant)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]


class MPIUnavailable(RuntimeError):
    """Open MPI or mpi4py could not be installed or run here; the message starts with the first error seen."""


def _run(argv: list[str], deadline: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic())
        )
    except subprocess.TimeoutExpired:
        raise MPIUnavailable(f"`{' '.join(argv)}` did not finish in time") from None
    except OSError as error:
        raise MPIUnavailable(f"`{' '.join(argv)}` could not start: {error}") from None


def ensure_openmpi(timeout: float = 180) -> None:
    """Install Open MPI with apt-get unless ``mpirun`` is already there.

    Raises:
        MPIUnavailable: not root, no apt-get, or apt-get failed (with apt's first error).

    Example:
        >>> ensure_openmpi()  # doctest: +SKIP
    """
    if shutil.which("mpirun") is not None:
        return
    how = f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
    if not sys.platform.startswith("linux") or shutil.which("apt-get") is None:
        raise MPIUnavailable("mpirun is not installed and there is no apt-get here; install Open MPI")
    if os.geteuid() != 0:
        raise MPIUnavailable(f"mpirun is not installed and this is not root; run `{how}` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=120"]
    install = ["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    deadline = time.monotonic() + timeout
    done = _run(install, deadline, env)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        updated = _run(["apt-get", *lock, "update", "-qq"], deadline, env)
        if updated.returncode != 0:
            raise MPIUnavailable(f"`apt-get update` failed: {_first_error(updated.stderr + updated.stdout)}")
        done = _run(install, deadline, env)
    if done.returncode != 0:
        raise MPIUnavailable(f"`{how}` failed (exit code {done.returncode}): {_first_error(done.stderr + done.stdout)}")
    if shutil.which("mpirun") is None:
        raise MPIUnavailable(f"`{how}` succeeded but mpirun is still missing")


def ensure_mpi4py(timeout: float = 180) -> Path:
    """Install mpi4py into :data:`MPI4PY_TARGET` unless it is there; return the folder for ``PYTHONPATH``.

    Raises:
        MPIUnavailable: pip failed (with its first error).

    Example:
        >>> ensure_mpi4py()  # doctest: +SKIP
        PosixPath('.../.venv-mpi/site')
    """
    if (MPI4PY_TARGET / "mpi4py" / "__init__.py").is_file():
        return MPI4PY_TARGET
    argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--target"]
    done = _run([*argv, str(MPI4PY_TARGET), "mpi4py"], time.monotonic() + timeout)
    if done.returncode != 0:
        shutil.rmtree(MPI4PY_TARGET, ignore_errors=True)
        raise MPIUnavailable(f"`pip install mpi4py` failed: {_first_error(done.stderr + done.stdout)}")
    return MPI4PY_TARGET


def mpi_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with mpi4py's folder first on ``PYTHONPATH`` and Open MPI allowed to run as root."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([str(MPI4PY_TARGET), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def ensure_installed(timeout: float = 180) -> Path:
    """Open MPI and mpi4py, installed when missing, and checked by a two-rank ``mpirun``; the mpi4py folder.

    Raises:
        MPIUnavailable: with the first error of the step that failed.

    Example:
        >>> ensure_installed()  # doctest: +SKIP
    """
    deadline = time.monotonic() + timeout
    ensure_openmpi(timeout)
    target = ensure_mpi4py(max(1.0, deadline - time.monotonic()))
    # one write() per rank: the ranks share mpirun's pipe, and print() writes its pieces separately when unbuffered
    code = "import os; from mpi4py import MPI; os.write(1, f'SIZE {MPI.COMM_WORLD.Get_size()}\\n'.encode())"
    argv = [*MPIRUN, "-np", "2", sys.executable, "-c", code]
    done = _run(argv, max(deadline, time.monotonic() + 60), mpi_env(dict(os.environ)))
    if done.returncode != 0 or done.stdout.count("SIZE 2") != 2:
        raise MPIUnavailable(
            f"`mpirun -np 2 python -c 'from mpi4py import MPI'` failed (exit code {done.returncode}, expected two"
            f" lines 'SIZE 2'): {_first_error(done.stderr + done.stdout)} (stdout: {done.stdout[-300:]!r})"
        )
    return target


if __name__ == "__main__":
    print(ensure_installed())
