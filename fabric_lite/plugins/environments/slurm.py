"""The environment of processes started by SLURM's ``srun``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from typing_extensions import override

from fabric_lite._log import get_logger
from fabric_lite.plugins.environments.cluster_environment import _LauncherEnvironment
from fabric_lite.utilities.rank_zero import rank_zero_warn
from fabric_lite.utilities.warnings import PossibleUserWarning

log = get_logger(__name__)

# Job names that mean "an interactive shell inside an allocation", where the user starts processes by other means.
_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list (``"gpu[007-009],cpu1"``: ``"gpu007"``); ``ValueError`` if it is empty."""
    text = nodelist.strip()
    if not text:
        raise ValueError("SLURM_NODELIST is empty; cannot tell which host is the main node. Set MASTER_ADDR.")
    # the first host ends at the first comma or space outside brackets
    depth = 0
    end = len(text)
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch in ", " and depth == 0:
            end = i
            break
    # replace every bracket group by its first entry: "3-5,9" -> "3"
    return re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", text[:end])


def _slurm_interactive(env: Mapping[str, str]) -> bool:
    return env.get("SLURM_JOB_NAME") in _INTERACTIVE_JOB_NAMES


def _several_task_step(env: Mapping[str, str]) -> bool:
    """Whether ``srun`` started this process as one task of a step of several, whose tasks are the ranks."""
    step_tasks = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", ""))
    return _in_srun_step(env) and step_tasks.strip().isdigit() and int(step_tasks) > 1


def _started_by_srun(env: Mapping[str, str]) -> bool:
    """Whether SLURM started this process as one task of a job step (see :meth:`SLURMEnvironment.detect`)."""
    if "SLURM_NTASKS" not in env:
        return False  # outside SLURM
    if "SLURM_PROCID" not in env:
        if "SLURM_JOB_ID" in env:
            return False  # an salloc shell: SLURM started no task here
        return not _slurm_interactive(env)  # task variables set by hand: Lightning's rule
    if not _in_srun_step(env):
        if env.get("ENVIRONMENT") == "BATCH":
            return False  # the batch script: one process, not one of the job's tasks
        return not _slurm_interactive(env)  # task variables set by hand, without step information
    if _several_task_step(env):
        return True  # a step of several tasks: they are the ranks, whatever the job is called
    return not _slurm_interactive(env)


def _warn_if_srun_not_used(env: Mapping[str, str]) -> None:
    """Warn, as Lightning does, where ``srun`` exists but did not start this process (often a forgotten ``srun``)."""
    if sys.platform == "win32" or shutil.which("srun") is None or _started_by_srun(env):
        return
    command = " ".join(["srun", os.path.basename(sys.executable), *sys.argv])[:64]
    rank_zero_warn(
        "The `srun` command is available on this machine, but is not used. HINT: to run on SLURM, start the"
        f" script with srun: {command} ...",
        category=PossibleUserWarning,
    )


_TASKS_PER_NODE_VARIABLES = ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def _check_tasks_per_node_known(env: Mapping[str, str]) -> None:
    """Raise ``RuntimeError``, as Lightning does, for several tasks and no variable that says how many run per node."""
    try:
        ntasks = int(env.get("SLURM_NTASKS", "1"))
    except ValueError:
        return  # read, with its own error, where the world size is needed
    if ntasks > 1 and not any(name in env for name in _TASKS_PER_NODE_VARIABLES):
        raise RuntimeError(
            f"You set `--ntasks={ntasks}` in your SLURM bash script, but SLURM set no number of tasks per node"
            f" (none of {', '.join(_TASKS_PER_NODE_VARIABLES)}), so the processes of each node cannot be counted."
            f" HINT: Use `--ntasks-per-node={ntasks}` instead, or start the tasks with srun."
        )


def _in_srun_step(env: Mapping[str, str]) -> bool:
    """Whether this process belongs to a job step that ``srun`` started (the batch script and salloc do not)."""
    return "SLURM_STEP_ID" in env or "SLURM_STEPID" in env


def _uniform_count(spec: str) -> int | None:
    """The count of a tasks-per-node list where every node has the same (``"2(x3)"``: 2), else ``None`` (``"2,1"``)."""
    counts = {int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", spec)}
    return counts.pop() if len(counts) == 1 else None


def _note_not_started_by_srun(env: Mapping[str, str], processes: int) -> str | None:
    """What to tell a process of a several-task SLURM job that ``srun`` did not start (fabric_lite then starts
    ``processes`` itself); ``None`` outside SLURM, in an ``srun`` task, and for a job of one task."""
    if "SLURM_JOB_ID" not in env or SLURMEnvironment.detect(env):
        return None
    ntasks = env.get("SLURM_NTASKS", "")
    if not ntasks.isdigit() or int(ntasks) < 2:
        return None
    if "SLURM_PROCID" not in env:
        where = "an salloc shell"
    elif not _in_srun_step(env) and env.get("ENVIRONMENT") == "BATCH":
        where = "the batch script"
    else:
        where = f"an interactive job (SLURM_JOB_NAME={env.get('SLURM_JOB_NAME')!r})"
    return (
        f"This process runs in {where} of SLURM job {env['SLURM_JOB_ID']} (SLURM_NTASKS={ntasks}), but srun did"
        f" not start it as one of the job's tasks, so fabric_lite runs {processes} process(es) on this node and"
        f" starts them itself. To let SLURM start the processes, run the script with srun: `srun"
        f" --ntasks-per-node={processes} python script.py`."
    )


class SLURMEnvironment(_LauncherEnvironment):
    """Processes started by ``srun`` (directly or inside an ``sbatch`` script); fabric_lite starts none itself.

    Ranks come from ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and ``SLURM_NTASKS`` (a missing one is a
    ``KeyError``). The main address is ``MASTER_ADDR``, else the first host of ``SLURM_NODELIST``; the port is
    ``MASTER_PORT``, else ``15000 +`` the job id's last four digits, so every task derives it without talking.
    :meth:`detect` is ``True`` only in a task ``srun`` started: in a batch script, an ``salloc`` shell or
    ``srun --pty bash`` fabric_lite starts the processes itself (docs/troubleshooting.md, "SLURM").

    Args:
        auto_requeue: At ``fabric.launch()``, install a handler for ``requeue_signal`` on which global rank 0 runs
            ``scontrol requeue <job id>``; a handler installed before it is still called.
        requeue_signal: The signal SLURM sends before the time limit. Defaults to ``SIGUSR1`` (none on Windows).
        env: The variables to read (keyword only; copied). Defaults to ``os.environ``, read at each call; only then
            do the constructor and :meth:`detect` warn where ``srun`` exists but did not start this process.

    Raises:
        RuntimeError: several tasks, but no tasks-per-node variable (checked only when ``env`` is not given).

    Example::

        # sbatch --signal=USR1@90 --requeue job.sh, which runs: srun --ntasks-per-node=2 python train.py
        fabric = Fabric(plugins=[SLURMEnvironment(auto_requeue=True)])
    """

    _WORLD_SIZE, _GLOBAL_RANK, _LOCAL_RANK, _NODE_RANK = "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"
    _NODE_RANK_DEFAULT = None  # srun always sets SLURM_NODEID

    def __init__(
        self,
        auto_requeue: bool = True,
        requeue_signal: signal.Signals | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(auto_requeue, bool):
            raise TypeError(
                f"SLURMEnvironment(auto_requeue={auto_requeue!r}) must be True or False. To pass the environment"
                " variables, use the keyword: SLURMEnvironment(env={...})."
            )
        super().__init__(env)
        self.auto_requeue = auto_requeue
        if requeue_signal is None and sys.platform != "win32":
            requeue_signal = signal.SIGUSR1
        if requeue_signal is not None:
            try:
                requeue_signal = signal.Signals(requeue_signal)
            except (ValueError, TypeError):
                raise ValueError(
                    f"SLURMEnvironment(requeue_signal={requeue_signal!r}) is not a signal. Example:"
                    " requeue_signal=signal.SIGUSR1 (SLURM's --signal=USR1@90)."
                ) from None
        self.requeue_signal = requeue_signal
        self._previous_handler: Any = None
        self._handler_installed = False
        if env is None:  # the process's own variables, as Lightning reads them at construction
            _check_tasks_per_node_known(self._env)
            _warn_if_srun_not_used(self._env)

    @staticmethod
    def job_name(env: Mapping[str, str] | None = None) -> str | None:
        """``SLURM_JOB_NAME`` of ``env`` (default ``os.environ``), or ``None``."""
        return (os.environ if env is None else env).get("SLURM_JOB_NAME")

    @staticmethod
    def job_id(env: Mapping[str, str] | None = None) -> int | None:
        """``SLURM_JOB_ID`` of ``env`` (default ``os.environ``) as an int; ``None`` outside SLURM and in an
        interactive job (named ``bash`` or ``interactive``)."""
        env = os.environ if env is None else env
        if _slurm_interactive(env):
            return None
        job_id = env.get("SLURM_JOB_ID", "")
        return int(job_id) if job_id.isdigit() else None

    @staticmethod
    def resolve_root_node_address(nodes: str) -> str:
        """The first host of a SLURM host list (:func:`first_host`)."""
        return first_host(nodes)

    # ------------------------------------------------------------------------------------------ auto-requeue
    def _on_setup(self, global_rank: int) -> None:
        """Install the requeue handler (main thread only), once the process knows its global rank."""
        if not self.auto_requeue or self.requeue_signal is None or self._handler_installed:
            return
        if threading.current_thread() is not threading.main_thread():
            log.debug("not installing the SLURM requeue handler: signal handlers can only be set in the main thread")
            return
        signum = self.requeue_signal
        previous = signal.getsignal(signum)

        def on_requeue_signal(received: int, frame: FrameType | None) -> None:
            if global_rank == 0:
                self._requeue()
            if callable(previous):
                previous(received, frame)

        signal.signal(signum, on_requeue_signal)
        self._previous_handler = previous
        self._handler_installed = True

    def _requeue(self) -> None:
        """``scontrol requeue`` this job (an array job's task as ``<array id>_<task id>``)."""
        array_id = self._env.get("SLURM_ARRAY_JOB_ID")
        if array_id is not None:
            job_id = f"{array_id}_{self._env.get('SLURM_ARRAY_TASK_ID', '')}"
        else:
            job_id = self._env.get("SLURM_JOB_ID", "")
        if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):
            log.warning("cannot requeue: SLURM_JOB_ID=%r is not a SLURM job id", job_id)
            return
        log.info("requeuing SLURM job %s", job_id)
        try:
            done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            log.warning("requeuing SLURM job %s failed: %s", job_id, error)
            return
        if done.returncode == 0:
            log.info("requeued SLURM job %s", job_id)
        else:
            log.warning(
                "requeuing SLURM job %s failed with exit code %d: %s", job_id, done.returncode, done.stderr.strip()
            )

    @override
    def teardown(self) -> None:
        """Put back the signal handler that was there before the requeue handler."""
        signum = self.requeue_signal
        if self._handler_installed and signum is not None and threading.current_thread() is threading.main_thread():
            previous = self._previous_handler
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
            self._handler_installed = False

    @property
    @override
    def main_address(self) -> str:
        if "MASTER_ADDR" in self._env:
            return self._env["MASTER_ADDR"]
        return first_host(self._env.get("SLURM_NODELIST", self._env.get("SLURM_JOB_NODELIST", "127.0.0.1")))

    @property
    @override
    def main_port(self) -> int:
        if "MASTER_PORT" in self._env:
            return self._int("MASTER_PORT")
        digits = re.sub(r"\D", "", self._env.get("SLURM_JOB_ID", ""))
        return 15000 + int(digits[-4:]) if digits else 12910

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        """Whether ``srun`` started this process as one task of a job step (see the class); without ``env`` it also
        warns where ``srun`` exists but did not start this process."""
        if env is None:
            _warn_if_srun_not_used(os.environ)
        return _started_by_srun(os.environ if env is None else env)

    def tasks_per_node(self) -> int | None:
        """Tasks of this step per node, or ``None`` where nodes differ or SLURM does not say: the step's own
        ``SLURM_STEP_TASKS_PER_NODE`` (a step inherits the job's ``SLURM_NTASKS_PER_NODE``), else the latter, else a
        uniform ``SLURM_TASKS_PER_NODE``."""
        return self._tasks_per_node()[0]

    def _tasks_per_node(self) -> tuple[int | None, str]:
        """The count and the variable it came from."""
        step = self._env.get("SLURM_STEP_TASKS_PER_NODE")  # e.g. "2", "2(x3)" or "2,1"
        if step is not None:
            return _uniform_count(step), f"SLURM_STEP_TASKS_PER_NODE={step}"
        if "SLURM_NTASKS_PER_NODE" in self._env:
            return self._int("SLURM_NTASKS_PER_NODE"), f"SLURM_NTASKS_PER_NODE={self._env['SLURM_NTASKS_PER_NODE']}"
        spec = self._env.get("SLURM_TASKS_PER_NODE", "")
        return (_uniform_count(spec) if spec else None), f"SLURM_TASKS_PER_NODE={spec}"

    def num_nodes(self) -> int | None:
        """Nodes of this step: ``SLURM_STEP_NUM_NODES`` (set by ``srun``), else ``SLURM_NNODES``; ``None`` if unset."""
        name = self._nodes_variable()
        return self._int(name) if name in self._env else None

    def _nodes_variable(self) -> str:
        return "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in self._env else "SLURM_NNODES"

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ``ValueError`` where ``devices``/``num_nodes`` disagree with SLURM's tasks per node, nodes or tasks;
        skipped in an interactive job (fabric_lite starts its processes) unless ``srun`` started several tasks."""
        if self.job_name(self._env) in _INTERACTIVE_JOB_NAMES and not _several_task_step(self._env):
            return
        per_node, source = self._tasks_per_node()
        if per_node is not None and per_node != num_devices:
            raise ValueError(
                f"Fabric(devices={num_devices}) does not match SLURM's {per_node} tasks per node ({source}, from"
                " --ntasks-per-node or -n). Each task is one process, so the number of tasks per node configured in"
                f" SLURM and `devices` must be equal: {per_node} does not match {num_devices}. Set devices={per_node}"
                f" (or 'auto'), or ask SLURM for --ntasks-per-node={num_devices}."
            )
        nnodes = self.num_nodes()
        if nnodes is not None and nnodes != num_nodes:
            raise ValueError(
                f"Fabric(num_nodes={num_nodes}) does not match SLURM's --nodes={nnodes} ({self._nodes_variable()}):"
                f" the number of nodes configured in SLURM ({nnodes}) does not match num_nodes={num_nodes}. Set"
                f" num_nodes={nnodes}, or ask SLURM for --nodes={num_nodes}."
            )
        if "SLURM_NTASKS" in self._env and self.world_size() != num_devices * num_nodes:
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes,"
                f" but SLURM started {self.world_size()} tasks (SLURM_NTASKS). Start the script with"
                f" `srun --ntasks-per-node={num_devices} --nodes={num_nodes}`, or change devices/num_nodes."
            )
