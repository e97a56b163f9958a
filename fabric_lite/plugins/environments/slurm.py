"""The environment of processes started by SLURM's ``srun``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment

# Job names that mean "an interactive shell inside an allocation", where the user starts processes by other means.
_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list.

    Handles plain lists separated by commas or spaces and bracketed ranges, including several bracket groups and
    zero padding: ``"node[3-5,9]"`` gives ``"node3"``, ``"gpu[007-009],cpu1"`` gives ``"gpu007"``,
    ``"rack[1-2]-n[4,6]"`` gives ``"rack1-n4"``.
    """
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
    host = text[:end]
    # replace every bracket group by its first entry: "3-5,9" -> "3"
    return re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", host)


def _slurm_interactive(env: Mapping[str, str]) -> bool:
    return env.get("SLURM_JOB_NAME") in _INTERACTIVE_JOB_NAMES


def _in_srun_step(env: Mapping[str, str]) -> bool:
    """Whether this process belongs to a job step that ``srun`` started (the batch script and salloc do not)."""
    return "SLURM_STEP_ID" in env or "SLURM_STEPID" in env


def _uniform_count(spec: str) -> int | None:
    """The count of a SLURM tasks-per-node list when every node has the same: ``"2(x3)"`` and ``"2(x2),2"`` give 2,
    ``"2,1"`` gives ``None``."""
    counts = {int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", spec)}
    return counts.pop() if len(counts) == 1 else None


def _step_tasks(env: Mapping[str, str]) -> int | None:
    value = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", ""))
    return int(value) if value.strip().isdigit() else None


def _note_not_started_by_srun(env: Mapping[str, str], processes: int) -> str | None:
    """A note for a process inside a SLURM job of several tasks that ``srun`` did not start as one of them.

    This is the batch script itself (``python train.py`` in an ``sbatch`` script without ``srun``), an ``salloc``
    shell, or a job named ``bash``/``interactive``. fabric_lite then runs ``processes`` processes on this node,
    started by itself, rather than waiting for tasks that SLURM will never start. Returns ``None`` outside SLURM,
    for a task of an ``srun`` step, and where the job (or the step) has one task.

    Example:
        >>> _note_not_started_by_srun({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}, 2) is not None
        True
    """
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


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by ``srun`` (directly or inside an ``sbatch`` script); fabric_lite starts none itself.

    Reads ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NTASKS``, the tasks per node
    (:meth:`tasks_per_node`), the nodes (:meth:`num_nodes`), ``SLURM_NODELIST`` and ``SLURM_JOB_ID``. The main
    address is ``MASTER_ADDR`` or else the first host of ``SLURM_NODELIST``; the port is ``MASTER_PORT`` or else
    ``15000 +`` the last four digits of the job id (the same choice as Lightning, so every task computes the same
    port without talking to the others).

    Detected (by :meth:`detect`) only in a process that SLURM started as one task of a job step, that is under
    ``srun``. Elsewhere inside a SLURM job fabric_lite starts the processes itself, as on any machine, instead of
    waiting for tasks that SLURM will never start:

    * the batch script itself (``python train.py`` in an ``sbatch`` script, without ``srun``),
    * an ``salloc`` shell (``salloc -n 2``, then ``python train.py``),
    * a single-task step of a job named ``bash`` or ``interactive``, such as the shell of ``srun --pty bash``
      (Lightning's convention for interactive jobs).

    A step of several tasks is SLURM's to manage whatever the job is called: ``salloc`` names its allocation
    ``interactive``, and ``srun -n 2 python train.py`` run in it inherits that name (Lightning ignores SLURM there,
    and every task starts its own processes). Pass ``plugins=[SLURMEnvironment()]`` to use SLURM's variables in
    any case.

    Example:
        srun --ntasks-per-node=2 python train.py   # Fabric(devices="auto") takes 2 processes per node from SLURM
    """

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

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
        job_id = self._env.get("SLURM_JOB_ID", "")
        digits = re.sub(r"\D", "", job_id)
        return 15000 + int(digits[-4:]) if digits else 12910

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        env = os.environ if env is None else env
        if "SLURM_NTASKS" not in env or "SLURM_PROCID" not in env:
            return False  # outside SLURM, or an salloc shell: SLURM started no task here
        if not _in_srun_step(env):
            if env.get("ENVIRONMENT") == "BATCH":
                return False  # the batch script: one process, not one of the job's tasks
            return not _slurm_interactive(env)  # task variables set by hand, without step information
        step_tasks = _step_tasks(env)
        if step_tasks is not None and step_tasks > 1:
            return True  # a step of several tasks: they are the ranks, whatever the job is called
        return not _slurm_interactive(env)

    @override
    def world_size(self) -> int:
        return self._int("SLURM_NTASKS")

    @override
    def set_world_size(self, size: int) -> None:
        pass  # SLURM decides

    @override
    def global_rank(self) -> int:
        return self._int("SLURM_PROCID")

    @override
    def set_global_rank(self, rank: int) -> None:
        pass  # SLURM decides

    @override
    def local_rank(self) -> int:
        return self._int("SLURM_LOCALID")

    @override
    def node_rank(self) -> int:
        return self._int("SLURM_NODEID", 0)

    def tasks_per_node(self) -> int | None:
        """Tasks of this step on each node; ``None`` when nodes have different counts or SLURM does not say.

        Read from the step's ``SLURM_STEP_TASKS_PER_NODE`` (set by ``srun``), else ``SLURM_NTASKS_PER_NODE``, else a
        uniform ``SLURM_TASKS_PER_NODE``. The step's own count comes first because ``srun -n 1`` inside an
        ``sbatch --ntasks-per-node=2`` job inherits ``SLURM_NTASKS_PER_NODE=2`` from the job.

        Example:
            >>> SLURMEnvironment({"SLURM_TASKS_PER_NODE": "2(x3)"}).tasks_per_node()
            2
        """
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
        """Nodes of this step: ``SLURM_STEP_NUM_NODES`` (set by ``srun``), else ``SLURM_NNODES``; ``None`` if unset.

        Example:
            >>> SLURMEnvironment({"SLURM_NNODES": "2"}).num_nodes()
            2
        """
        name = self._nodes_variable()
        return self._int(name) if name in self._env else None

    def _nodes_variable(self) -> str:
        return "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in self._env else "SLURM_NNODES"

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node, source = self._tasks_per_node()
        if per_node is not None and per_node != num_devices:
            raise ValueError(
                f"Fabric(devices={num_devices}) does not match SLURM's {per_node} tasks per node"
                f" ({source}, from --ntasks-per-node or -n). Set devices={per_node} (or 'auto'), or ask SLURM for"
                f" --ntasks-per-node={num_devices}."
            )
        nnodes = self.num_nodes()
        if nnodes is not None and nnodes != num_nodes:
            raise ValueError(
                f"Fabric(num_nodes={num_nodes}) does not match SLURM's --nodes={nnodes} ({self._nodes_variable()})."
                f" Set num_nodes={nnodes}, or ask SLURM for --nodes={num_nodes}."
            )
        ntasks = self.world_size()
        if ntasks != num_devices * num_nodes:
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes,"
                f" but SLURM started {ntasks} tasks (SLURM_NTASKS). Start the script with"
                f" `srun --ntasks-per-node={num_devices} --nodes={num_nodes}`, or change devices/num_nodes."
            )
