"""Two hosts for real: a two-node `fabric-lite run` job across two network namespaces on this machine.

Each "host" is a network namespace with one end of a veth pair (tests/helpers/cluster/netns.py): its own address
(10.231.0.1 and .2), loopback and ports, and no route anywhere but to the other. Every node runs
`fabric-lite run --num-nodes 2 --node-rank N --main-address 10.231.0.1 --main-port P` inside its namespace,
with GLOO_SOCKET_IFNAME naming its veth end, so every byte between the nodes crosses the link.

* one and two processes per node: the collectives see every rank, and the weights after training equal those
  of the same job on one node (same global batch, same world size: bit for bit);
* a host taken away mid-training (its processes killed at once, or its link brought down) ends the job on the
  other host within the process-group timeout, with the failure named in the root-cause report.

Needs root and iproute2 (`ip netns`); skipped with the reason otherwise. Namespaces have unique names and are
deleted after every test, also after a failure; every process of both nodes is killed and checked gone.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.cluster.netns import Host, set_link, two_hosts, unavailable_reason
from tests.helpers.cluster.processes import Job, run_tagged
from tests.helpers.harness import Completed, base_env

SCRIPT = "tests/helpers/scripts/cli_train.py"
# the namespaces are new and private: nothing else listens there, so a fixed port cannot be taken
PORT = 29400
# the process-group timeout of the jobs: long enough for both nodes to start on a busy 2-core machine
PG_TIMEOUT = 15
REASON = unavailable_reason()

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(REASON is not None, reason=f"two-hosts tier: {REASON}"),
]


def results(done: Completed) -> list[dict[str, Any]]:
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda row: row["rank"])


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    with two_hosts() as pair:
        yield pair


class Nodes:
    """The two nodes of one job, each a tagged background `fabric-lite run` in its namespace."""

    def __init__(self, hosts: tuple[Host, Host], nproc: int, script_args: list[str]) -> None:
        self.jobs: list[Job] = []
        main = hosts[0].address
        try:
            for rank, host in enumerate(hosts):
                argv = [sys.executable, "-m", "fabric_lite", "run", "--accelerator", "cpu", "--devices", str(nproc)]
                argv += ["--num-nodes", "2", "--node-rank", str(rank), "--main-address", main]
                env = base_env({"GLOO_SOCKET_IFNAME": host.interface})  # gloo must use the veth end's address
                argv += ["--main-port", str(PORT), SCRIPT, *script_args]
                self.jobs.append(Job(argv, env, f"node{rank}", prefix=host.prefix()))
        except BaseException:
            for job in self.jobs:
                job.close()
            raise

    def close(self) -> None:
        """Kill what is left of both nodes. A node whose command ended must have left nothing behind; one still
        running is a host the test took away, and is killed here."""
        ended = [job.process.poll() is not None for job in self.jobs]
        leftovers = {job.label: job.close() for job in self.jobs}
        orphans = {label: pids for (label, pids), done in zip(leftovers.items(), ended) if done and pids}
        assert not orphans, f"processes outlived their node's command (killed now): {orphans}"


@pytest.fixture
def nodes(hosts: tuple[Host, Host]) -> Iterator[list[Nodes]]:
    """The jobs a test starts; killed before the namespaces go (this fixture depends on ``hosts``)."""
    started: list[Nodes] = []
    yield started
    for job in started:
        job.close()


@pytest.fixture(scope="module")
def one_node_weights(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], dict[str, torch.Tensor]]:
    """The weights after the same job on one node with `world` processes (each world size run once)."""
    cache: dict[int, dict[str, torch.Tensor]] = {}
    folder = tmp_path_factory.mktemp("one_node")

    def weights(world: int) -> dict[str, torch.Tensor]:
        if world not in cache:
            out = folder / f"one_node_{world}.pt"
            args = ["-m", "fabric_lite", "run", "--accelerator", "cpu", "--devices", str(world), SCRIPT]
            done = run_tagged([*args, "--out", str(out)], timeout=150)
            assert done.returncode == 0, done.output
            cache[world] = torch.load(out, weights_only=True)
        return cache[world]

    return weights


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [1, 2], ids=["1-per-node", "2-per-node"])
def test_two_node_job_matches_the_one_node_run(
    nproc: int,
    hosts: tuple[Host, Host],
    nodes: list[Nodes],
    one_node_weights: Callable[[int], dict[str, torch.Tensor]],
    tmp_path: Path,
) -> None:
    world = 2 * nproc
    reference = one_node_weights(world)
    job = Nodes(hosts, nproc, ["--out", str(tmp_path / "two_nodes.pt")])
    nodes.append(job)
    done = [node.wait(timeout=150) for node in job.jobs]
    for node in done:
        assert node.returncode == 0, node.output
    rows = results(done[0]) + results(done[1])
    assert [r["rank"] for r in rows] == list(range(world)), rows
    for node_rank, node in enumerate(done):
        for row in results(node):
            assert row["node_rank"] == node_rank and row["local_rank"] == row["rank"] - node_rank * nproc
            assert row["world"] == world and row["main"] == f"{hosts[0].address}:{PORT}"
            assert row["total"] == world * (world + 1) / 2 and row["gathered"] == list(range(world))
    trained = torch.load(tmp_path / "two_nodes.pt", weights_only=True)
    assert trained.keys() == reference.keys()
    for key in trained:
        assert torch.equal(trained[key], reference[key]), key


def start_long_job(hosts: tuple[Host, Host], nodes: list[Nodes], started: Path) -> Nodes:
    """A two-node job (one process per node) that trains for minutes; returns once its first step is done."""
    args = ["--steps", "100000", "--step-sleep", "0.05", "--started", str(started), "--pg-timeout", str(PG_TIMEOUT)]
    job = Nodes(hosts, 1, args)
    nodes.append(job)
    deadline = time.monotonic() + 120
    while not started.exists():
        for node in job.jobs:
            if node.process.poll() is not None:
                stdout, stderr = node.output()
                pytest.fail(f"{node.label} ended before training started:\n{stdout}\n{stderr}")
        if time.monotonic() > deadline:
            pytest.fail("the two-node job did not start training within 120 s")
        time.sleep(0.1)
    time.sleep(0.5)  # a few steps in: the ranks now meet in every step's gradient all-reduce
    return job


def root_cause(done: Completed) -> str:
    parts = done.stderr.split("Root Cause (first observed failure):", 1)
    assert len(parts) == 2, f"no root-cause report\n{done.output}"
    return parts[1]


@pytest.mark.timeout(240)
def test_killing_a_host_ends_the_job_on_the_other(hosts: tuple[Host, Host], nodes: list[Nodes], tmp_path: Path) -> None:
    job = start_long_job(hosts, nodes, tmp_path / "started")
    killed = job.jobs[1].kill()  # the agent and its worker at once, as if the machine had died
    assert len(killed) == 2, killed
    lost = time.monotonic()
    done = job.jobs[0].wait(timeout=PG_TIMEOUT + 30)
    elapsed = time.monotonic() - lost
    assert done.returncode == 1, done.output
    # the lost peer's connection closes at once: no need to wait for the timeout
    assert elapsed < PG_TIMEOUT, f"node 0 took {elapsed:.1f} s to end\n{done.output}"
    cause = root_cause(done)
    assert "rank      : 0 (local_rank: 0)" in cause, done.output
    # gloo's words depend on whether rank 0 was reading or writing when the peer vanished
    assert re.search(r"Connection (reset|closed) by peer|Broken pipe", cause), done.output
    assert hosts[1].address in cause, done.output  # the message names the lost host's address
    print(f"node 0 ended {elapsed:.1f} s after node 1 was killed")


@pytest.mark.timeout(240)
def test_link_down_ends_the_job_on_the_other_host_at_the_timeout(
    hosts: tuple[Host, Host], nodes: list[Nodes], tmp_path: Path
) -> None:
    job = start_long_job(hosts, nodes, tmp_path / "started")
    set_link(hosts[1], up=False)  # node 1's packets go nowhere; no connection is closed, nothing is reset
    lost = time.monotonic()
    done = job.jobs[0].wait(timeout=PG_TIMEOUT + 30)
    elapsed = time.monotonic() - lost
    assert done.returncode == 1, done.output
    assert PG_TIMEOUT - 1 < elapsed < PG_TIMEOUT + 20, f"node 0 took {elapsed:.1f} s to end\n{done.output}"
    cause = root_cause(done)
    assert "rank      : 0 (local_rank: 0)" in cause, done.output
    assert f"timed out after 0:00:{PG_TIMEOUT}" in cause and "rank(s) [1] never took part" in cause, done.output
    print(f"node 0 ended {elapsed:.1f} s after node 1's link went down (timeout {PG_TIMEOUT} s)")
    # node 1 is the host that was taken away: the `nodes` fixture kills what is left of it
