"""Where every rank is when a job hangs: the hang report, from jobs that really hang (issue 25).

Two ranks, a 5 s collective timeout, and rank 1 going wrong in one of four ways (``sleep``: it sleeps before
all_reduce #N; ``skip``: it skips it; ``other``: it calls ``broadcast`` where rank 0 calls ``barrier``; ``kill``: it
SIGKILLs itself), under each launcher: the ``ddp`` script launcher, ``ddp_spawn``, plain torchrun and ``fabric-lite
run`` (see tests/helpers/scripts/hang_cases.py). Every job must end within the timeout plus 15 s, print exactly one
report block with one line per rank naming its collective, its number and its line in the script, and leave no
process and (under fabric_lite's launchers) no run folder behind.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, _run_bounded, base_env

pytestmark = pytest.mark.distributed

SCRIPT = "tests/helpers/scripts/hang_cases.py"
TIMEOUT_S = 5.0
MODES = {
    "ddp": [SCRIPT],
    "ddp_spawn": [SCRIPT],
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT],
    "cli": ["-m", "fabric_lite", "run", "--accelerator", "cpu", "--devices", "2", SCRIPT],
}
RANK_LINE = re.compile(r"^  rank (\d+) \(pid (\d+), (alive|killed by SIG\w+|exited with code -?\d+|gone)\): (.+)$")
BLOCK_START = "fabric_lite: where every rank was"
# torch prefixes the lines of an uncaught exception in a rank with the rank
PREFIX = re.compile(r"^\[rank\d+\]: ", re.MULTILINE)


def sites() -> dict[str, int]:
    """The line of each ``# site: <name>`` comment in the script."""
    lines = (REPO / SCRIPT).read_text().splitlines()
    return {line.split("# site: ")[1].strip(): i for i, line in enumerate(lines, 1) if "# site: " in line}


def report_blocks(output: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    lines = PREFIX.sub("", output).splitlines()
    for i, line in enumerate(lines):
        if line.startswith(BLOCK_START):
            block = [line]
            for following in lines[i + 1 :]:
                if not following.startswith("  "):
                    break
                block.append(following)
            blocks.append(block)
    return blocks


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", ["sleep", "skip", "other", "kill"])
def test_every_rank_is_named_where_it_was(case: str, mode: str, tmp_path: Path) -> None:
    env = base_env({"TMPDIR": str(tmp_path)})  # foreign launchers' run folders go to the temp folder
    started = time.monotonic()
    argv = [sys.executable, *MODES[mode], "--case", case, "--mode", mode]
    done = _run_bounded(argv, 50.0, env, REPO, expect_orphans=False)
    exited = started + done.seconds
    output = done.stdout + "\n" + done.stderr
    assert done.returncode != 0, done.output

    hang = re.search(r"^HANG ([0-9.]+)$", done.stdout, re.MULTILINE)
    assert hang, done.output
    bound = 15.0 if case == "kill" else TIMEOUT_S + 15.0
    assert exited - float(hang.group(1)) <= bound, f"took {exited - float(hang.group(1)):.1f} s\n{done.output}"

    blocks = report_blocks(output)
    assert len(blocks) == 1, f"{len(blocks)} report blocks\n{done.output}"
    block = blocks[0]
    ranks = {int(m.group(1)): m for m in (RANK_LINE.match(line) for line in block) if m}
    assert sorted(ranks) == [0, 1], "\n".join(block)
    line = sites()
    zero, one = ranks[0].group(4), ranks[1].group(4)
    expected_zero = {
        "sleep": ("all_reduce", "target"),
        "skip": ("all_reduce", "target"),
        "kill": ("all_reduce", "target"),
        "other": ("barrier", "other0"),
    }[case]
    found = re.search(rf"{expected_zero[0]}[^#]* #(\d+) at hang_cases.py:{line[expected_zero[1]]}\b", zero)
    assert found, "\n".join(block)
    number = int(found.group(1))
    expected_one = {
        "sleep": rf"barrier #{number - 1} at hang_cases.py:{line['ready']}\b",
        "kill": rf"barrier #{number - 1} at hang_cases.py:{line['ready']}\b",
        "skip": rf"barrier #{number} at hang_cases.py:{line['after']}\b",
        "other": rf"broadcast[^#]* #{number} at hang_cases.py:{line['other1']}\b",
    }[case]
    assert re.search(expected_one, one), "\n".join(block)
    if case == "kill":
        if mode in ("ddp", "ddp_spawn"):  # the launcher is rank 1's parent, and knows how it ended
            assert ranks[1].group(3) == "killed by SIGKILL", "\n".join(block)
            assert "rank 1 died (killed by SIGKILL)" in block[-1], "\n".join(block)
        else:  # torchrun's agent does, but the report comes from rank 0, which only sees that rank 1 is gone
            assert ranks[1].group(3) == "gone", "\n".join(block)
            assert "rank 1 is gone" in block[-1], "\n".join(block)
    if case == "sleep":
        assert ranks[1].group(3) == "alive" and "waiting" in zero, "\n".join(block)
        assert f"      hang_cases.py:{line['sleep']} in run" in block, "\n".join(block)  # rank 1's stack
        assert block[-1] == f"  diagnosis: rank 1 is behind (last #{number - 1} while rank 0 waits in #{number})"
    if case in ("skip", "other"):
        assert f"ranks called different collectives at #{number}" in block[-1], "\n".join(block)

    # every process of the job is gone (the harness also fails the test on any process left in its session)
    pids = {int(p) for p in re.findall(r"^PID \d+ (\d+)$", done.stdout, re.MULTILINE)}
    pids |= {int(m.group(2)) for m in ranks.values()}
    deadline = time.monotonic() + 2.0
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    if mode != "torchrun":  # fabric_lite's launchers remove the run folder
        run_dir = re.search(r"^RUNDIR (.+)$", done.stdout, re.MULTILINE)
        assert run_dir and not Path(run_dir.group(1)).exists(), done.output
