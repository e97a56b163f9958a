"""A real one-node SLURM cluster on localhost (munged, slurmctld, slurmd), for tests and for trying things out.

    with SlurmCluster() as cluster:                      # starts in about a second once the packages are there
        done = cluster.run(["srun", "-n", "2", "hostname"], timeout=30)

    python -m tests.helpers.cluster.slurm_cluster -- srun -n 2 python examples/train.py --devices 2 --epochs 1
    python -m tests.helpers.cluster.slurm_cluster               # start, print `export SLURM_CONF=...`, wait for Ctrl-C

:func:`ensure_installed` installs Debian's ``slurm-wlm`` and ``munge`` with apt-get when a binary is missing
(root only; about 15-30 s the first time, nothing afterwards). Everything else lives in one temporary folder:
the munge key and socket, ``slurm.conf`` (every SLURM client and daemon finds it through ``SLURM_CONF``), state,
spool, logs. Nothing is written to ``/etc/slurm`` or ``/etc/munge`` and Debian's own services are never started.

The daemons run in the foreground as children of this process, each in its own session, and die with it
(``PR_SET_PDEATHSIG``) even if it is killed with SIGKILL. :meth:`SlurmCluster.stop` cancels every job, stops the
daemons (SIGTERM, then SIGKILL), kills any process still carrying this cluster's ``SLURM_CONF`` (job steps,
tasks) and removes the folder. What did not work here, and why the configuration is as it is:

* munged refuses a socket folder that others cannot enter (0755, not 0700) and a key others can read (0400);
* the cgroup plugins fail in a container (``cgroup namespace 'freezer' not mounted``), so processes are tracked
  with ``proctrack/linuxproc`` and tasks are not bound (``task/none``);
* there is no accounting database, so jobs are followed with ``sbatch --wait`` and ``squeue``, not ``sacct``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

#: Debian packages that provide every binary below (``bc``, used by the shell recipe this grew from, is not needed)
PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "squeue", "scancel")
#: CPUs the node declares; more than this machine has (``config_overrides``), so that a job that is still
#: completing never blocks the next one and three-task jobs fit on a two-core machine
NODE_CPUS = 4


class ClusterUnavailable(RuntimeError):
    """SLURM could not be installed or started here; the message starts with the first error seen."""


def _which(name: str) -> str | None:
    """``name`` on ``PATH``, or in the system folders a user's ``PATH`` may lack (the daemons are in /usr/sbin)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin"]))


def missing_binaries() -> list[str]:
    """The SLURM and munge programs not found on ``PATH`` (``/usr/sbin`` included).

    Example:
        >>> missing_binaries()  # doctest: +SKIP
        []
    """
    return [name for name in BINARIES if _which(name) is None]


def _first_error(text: str) -> str:
    """The first line of ``text`` that reads like an error, else its last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\b(E:|error|fatal|failed|denied|refus|unable|cannot|not found)", line, re.IGNORECASE):
            return line
    return lines[-1] if lines else "(no output)"


def ensure_installed(timeout: float = 600) -> None:
    """Install ``slurm-wlm`` and ``munge`` with apt-get unless every binary is already there; idempotent.

    Raises:
        ClusterUnavailable: not root, no apt-get, or apt-get failed (with apt's first error).

    Example:
        >>> ensure_installed()  # doctest: +SKIP
    """
    missing = missing_binaries()
    if not missing:
        return
    how = f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
    if not sys.platform.startswith("linux") or shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"{', '.join(missing)} not installed and there is no apt-get here; install SLURM")
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"{', '.join(missing)} not installed and this is not root; run `{how}` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=120"]  # wait for another apt instead of failing at once
    deadline = time.monotonic() + timeout
    for argv in (
        ["apt-get", *lock, "update", "-qq"],
        ["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            raise ClusterUnavailable(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
        if done.returncode != 0:
            raise ClusterUnavailable(
                f"`{' '.join(argv)}` failed (exit code {done.returncode}): {_first_error(done.stderr + done.stdout)}"
            )
    still = missing_binaries()
    if still:
        raise ClusterUnavailable(f"`{how}` succeeded but {', '.join(still)} are still missing")


def _first_job_id_with_free_ports(jobs: int = 64) -> int:
    """A first job id whose ``jobs`` ids derive rendezvous ports (``15000 +`` the last four digits) that nothing
    listens on now."""
    import random

    for _ in range(100):
        first = random.randrange(1000, 9000 - jobs)
        if all(_port_is_free(15000 + job) for job in range(first, first + jobs)):
            return first
    return 1000


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the process that started it dies (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment holds ``name=value`` exactly (everything started for one cluster)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class SlurmCluster:
    """A one-node SLURM cluster on localhost with all its state in one temporary folder.

    Args:
        cpus: CPUs the node declares (it may be more than the machine has).
        start_timeout: Seconds to wait for munged and for the node to become idle.
        base_env: Environment for the daemons and for :meth:`run` (default: ``os.environ``); ``SLURM_CONF`` is added.

    Example:
        >>> with SlurmCluster() as cluster:  # doctest: +SKIP
        ...     print(cluster.run(["srun", "-n", "2", "hostname"], timeout=30).stdout)
        localhost
        localhost
    """

    def __init__(
        self, *, cpus: int = NODE_CPUS, start_timeout: float = 30.0, base_env: Mapping[str, str] | None = None
    ) -> None:
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.root = Path(tempfile.mkdtemp(prefix="fabric_lite_slurm_"))
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.sock"
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.started_in: float | None = None

    # ------------------------------------------------------------------------------------------- life cycle
    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and slurmd and wait for the node to be idle; on any failure, stop everything.

        Raises:
            ClusterUnavailable: a daemon did not start, with the first error from its log.
        """
        begin = time.monotonic()
        try:
            self._start_munge()
            self._write_conf()
            self._daemon("slurmctld", ["slurmctld", "-D", "-c", "-i"])  # -c: no saved state, -i: ignore bad state
            self._daemon("slurmd", ["slurmd", "-D", "-N", "localhost"])
            self._wait_for(self._node_idle, "the node to become idle")
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - begin
        return self

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill whatever this cluster started, remove the folder. Idempotent."""
        if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.cancel_all()
        # slurmd first, so that it does not try to reach a controller that is gone; munged last
        for name in ("slurmd", "slurmctld", "munged"):
            process = self._daemons.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        # job steps and tasks are not children of ours: find them by this cluster's SLURM_CONF
        for pid in _pids_with_env("SLURM_CONF", str(self.conf)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    # ----------------------------------------------------------------------------------------------- clients
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: the cluster's ``base_env``) plus ``SLURM_CONF``, for SLURM commands and the jobs."""
        env = dict(self.base_env if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (``srun``, ``sbatch --wait``, ``salloc``) with a hard time bound.

        ``env`` is passed through :meth:`env`. On timeout the command's session is killed and every job cancelled,
        then ``subprocess.TimeoutExpired`` is raised with what the command printed.
        """
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env(env),
            cwd=cwd,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            self.cancel_all()
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(list(argv), timeout, output=stdout, stderr=stderr) from None
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    def _client(self, *argv: str, timeout: float = 10) -> str:
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout)
        return done.stdout if done.returncode == 0 else ""

    def jobs(self) -> list[str]:
        """Ids of the jobs in the queue (pending, running or completing)."""
        return self._client("squeue", "-h", "-o", "%i").split()

    def cancel_all(self) -> None:
        """Cancel every job (and with them their steps and tasks)."""
        jobs = self.jobs()
        if jobs:
            self._client("scancel", "--quiet", "--full", *jobs)

    def wait_for_empty_queue(self, timeout: float = 15) -> bool:
        """Wait until no job is left (a job stays ``COMPLETING`` briefly after its last task); ``True`` if empty."""
        deadline = time.monotonic() + timeout
        while self.jobs():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def task_processes(self) -> list[int]:
        """Processes of this cluster other than its daemons: job steps, tasks, and clients still running.

        The daemons' own helpers (slurmctld's ``slurmscriptd``) are not counted; slurmd's children (``slurmstepd``
        and the tasks under it) are.
        """
        daemons = {process.pid for process in self._daemons.values()}
        keep = {process.pid for name, process in self._daemons.items() if name != "slurmd"}
        found = []
        for pid in _pids_with_env("SLURM_CONF", str(self.conf)):
            if pid not in daemons and _parent(pid) not in keep:
                found.append(pid)
        return found

    def logs(self, lines: int = 20) -> str:
        """The last lines of every daemon log, for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # ------------------------------------------------------------------------------------------------ setup
    def _start_munge(self) -> None:
        self.root.chmod(0o755)  # munged checks every folder above its socket
        for name, mode in (("munge", 0o755), ("munge-key", 0o700), ("state", 0o755), ("spool", 0o755), ("log", 0o755)):
            (self.root / name).mkdir(mode=mode)
            (self.root / name).chmod(mode)
        key = self.root / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_dir = self.root / "munge"
        self._daemon(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={self.socket}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
        )
        self._wait_for(self._munge_works, "munged to answer")

    def _munge_works(self) -> bool:
        if not self.socket.exists():
            return False
        credential = subprocess.run(["munge", "-n", "-S", str(self.socket)], capture_output=True, timeout=5)
        if credential.returncode != 0:
            return False
        decoded = subprocess.run(
            ["unmunge", "-S", str(self.socket)], input=credential.stdout, capture_output=True, timeout=5
        )
        return decoded.returncode == 0

    def _write_conf(self) -> None:
        root = self.root
        settings = {
            "ClusterName": "fabriclite",
            "SlurmctldHost": "localhost(127.0.0.1)",
            # free ports, chosen now: never the default 6817/6818, never another cluster's
            "SlurmctldPort": _free_port(),
            "SlurmdPort": _free_port(),
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.socket}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": root / "state",
            "SlurmdSpoolDir": root / "spool",
            "SlurmctldPidFile": root / "slurmctld.pid",
            "SlurmdPidFile": root / "slurmd.pid",
            "SlurmctldLogFile": root / "log" / "slurmctld.log",
            "SlurmdLogFile": root / "log" / "slurmd.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "MailProg": "/bin/true",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "SchedulerType": "sched/builtin",  # plain FIFO: a job starts the moment it is submitted
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            "SlurmdParameters": "config_overrides",  # accept the declared CPUs even where the machine has fewer
            "MpiDefault": "none",
            "SwitchType": "switch/none",
            "ReturnToService": 2,
            "KillWait": 2,  # seconds between SIGTERM and SIGKILL when a job is cancelled or a task fails
            "InactiveLimit": 0,
            # `sbatch --wait` polls every 2 s only while that is under MinJobAge/2, else after 8 and 32 s more;
            "MinJobAge": 4,
            # fabric_lite (as Lightning) derives a job's rendezvous port from its id (15000 + the last four digits):
            # start the ids where those ports are free now, rather than at 1 (port 15001) in every session
            "FirstJobId": _first_job_id_with_free_ports(),
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines += [
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
            # MaxTime (minutes) bounds any job that a test forgot
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, name: str, argv: list[str]) -> None:
        program = _which(argv[0])
        if program is None:
            raise ClusterUnavailable(f"{argv[0]} is not installed; run ensure_installed() first")
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            self._daemons[name] = subprocess.Popen(
                [program, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.root,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def _node_idle(self) -> bool:
        return self._client("sinfo", "-h", "-N", "-o", "%t", timeout=5).strip() == "idle"

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            for name, process in self._daemons.items():
                if process.poll() is not None:
                    raise ClusterUnavailable(
                        f"{name} exited with code {process.returncode}: {self._first_log_error(name)}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                first = "; ".join(f"{n}: {self._first_log_error(n)}" for n in self._daemons)
                raise ClusterUnavailable(f"timed out after {self.start_timeout:.0f} s waiting for {what} ({first})")
            time.sleep(0.1)

    def _first_log_error(self, name: str) -> str:
        text = ""
        for path in (self.root / "log" / f"{name}.out", self.root / "log" / f"{name}.log"):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")
        return _first_error(text)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.helpers.cluster.slurm_cluster [-- COMMAND...]``: run COMMAND on a fresh cluster, or hold
    one."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[args.index("--") + 1 :] if "--" in args else []

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and `kill` both stop the cluster cleanly (SIGINT is ignored in a shell's background jobs otherwise)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        ensure_installed()
        cluster = SlurmCluster().start()
    except ClusterUnavailable as error:
        print(f"SLURM cluster unavailable: {error}", file=sys.stderr)
        return 2
    try:
        print(f"SLURM cluster up in {cluster.started_in:.1f} s: export SLURM_CONF={cluster.conf}", file=sys.stderr)
        if command:
            try:
                return subprocess.run(command, env=cluster.env()).returncode
            except KeyboardInterrupt:
                return 130
        print("Ctrl-C (or SIGTERM) stops it and removes the folder.", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
