"""s3fs and moto's S3 server for the S3 tier (tests/tiers/s3/test_s3.py), installed by the tests themselves.

    python -m tests.helpers.cluster.s3_setup      # install what is missing, print the PYTHONPATH entry holding them

* s3fs (fsspec's S3 filesystem) and moto's server (a real S3 HTTP API, kept in memory) are installed with this
  interpreter's pip into ``.venv-s3/site`` (``pip install --target``), a folder that the S3 jobs put on
  ``PYTHONPATH``. The project's ``.venv`` is left as it is, so everywhere else s3fs stays absent, as for a user
  who did not install it. ``moto[s3]`` plus flask and flask-cors is the smallest set that runs the server for S3
  (``moto[server]`` pulls cfn-lint, sympy and more, for other AWS services: ~300 MB instead of ~130 MB).
* :class:`S3Server` runs ``python -m moto.server`` on a free port of 127.0.0.1 in a child process, and stops it.

Installing takes about 40 s once and nothing afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers.cluster.slurm_cluster import _first_error

REPO = Path(__file__).resolve().parents[3]
#: where s3fs and moto go (ignored by git: .venv-*/)
S3_TARGET = REPO / ".venv-s3" / "site"
PACKAGES = ("s3fs", "moto[s3]", "flask", "flask-cors")
#: the fake credentials moto accepts; a real endpoint would refuse them
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Unavailable(RuntimeError):
    """s3fs or moto could not be installed or started here; the message starts with the first error seen."""


def ensure_installed(timeout: float = 180) -> Path:
    """Install s3fs and moto's S3 server into :data:`S3_TARGET` unless they are there; return the folder.

    Raises:
        S3Unavailable: pip failed (with its first error).

    Example:
        >>> ensure_installed()  # doctest: +SKIP
        PosixPath('.../.venv-s3/site')
    """
    marker = S3_TARGET / ".complete"
    if marker.is_file():
        return S3_TARGET
    shutil.rmtree(S3_TARGET, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(S3_TARGET)]
    try:
        done = subprocess.run([*argv, *PACKAGES], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        shutil.rmtree(S3_TARGET, ignore_errors=True)
        raise S3Unavailable(f"`pip install {' '.join(PACKAGES)}` did not finish in {timeout} s") from None
    if done.returncode != 0:
        shutil.rmtree(S3_TARGET, ignore_errors=True)
        raise S3Unavailable(f"`pip install {' '.join(PACKAGES)}` failed: {_first_error(done.stderr + done.stdout)}")
    marker.write_text(" ".join(PACKAGES))
    return S3_TARGET


def s3_env(base: dict[str, str], endpoint: str) -> dict[str, str]:
    """``base`` with :data:`S3_TARGET` on ``PYTHONPATH`` (its fsspec, the one s3fs pins, shadows the venv's),
    moto's credentials, and ``endpoint`` as the S3 endpoint for botocore (``AWS_ENDPOINT_URL``) and fsspec
    (``FSSPEC_S3_ENDPOINT_URL``)."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH", ""), str(S3_TARGET)) if p])
    env.update(CREDENTIALS)
    env["AWS_ENDPOINT_URL"] = endpoint
    env["FSSPEC_S3_ENDPOINT_URL"] = endpoint
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class S3Server:
    """moto's S3 server in a child process on 127.0.0.1, from :meth:`start` to :meth:`stop` (or the ``with``).

    Example:
        >>> with S3Server() as server:  # doctest: +SKIP
        ...     print(server.endpoint)  # http://127.0.0.1:PORT
    """

    def __init__(self) -> None:
        self.endpoint = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._log = REPO / ".venv-s3" / "server.log"

    def start(self, timeout: float = 30) -> S3Server:
        """Start the server and wait until it answers; raises :class:`S3Unavailable` with its output if not."""
        env = s3_env({k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "")
        env["PYTHONPATH"] = str(S3_TARGET)
        for _attempt in range(3):  # a port found free may be taken by someone else before the server binds it
            port = _free_port()
            with open(self._log, "wb") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            self.endpoint = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                    return self
                except (urllib.error.URLError, OSError):
                    time.sleep(0.1)
            self.stop()
        raise S3Unavailable(f"moto's server did not start: {_first_error(self._log.read_text(errors='replace'))}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); its objects are gone with it."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    print(ensure_installed())
