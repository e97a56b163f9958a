"""``progress_bar`` in new processes: without tqdm, and silence on ranks other than 0.

* In a fresh interpreter where tqdm cannot be imported, fabric_lite still imports, ``backend="auto"`` falls back to
  plain lines, and ``backend="tqdm"`` says what to install.
* Two ranks: only rank 0 shows progress, whether the rank comes from ``fabric=`` or from ``torch.distributed``, and
  every rank still gets every item.

The checks that start no process are in tests/unit/test_progress.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.harness import run_python, spawn_job


def test_without_tqdm_auto_falls_back_and_forcing_it_says_what_to_install() -> None:
    code = (
        "import io, sys\n"
        "sys.modules['tqdm'] = None  # as if tqdm were not installed: importing fabric_lite must not need it\n"
        "from fabric_lite.utilities import progress_bar\n"
        "class Terminal(io.StringIO):\n"
        "    def isatty(self):\n"
        "        return True\n"
        "print('BACKEND', progress_bar(range(2), file=Terminal()).backend)\n"
        "try:\n"
        "    progress_bar(range(2), backend='tqdm')\n"
        "except ModuleNotFoundError as err:\n"
        "    print('ERROR', err)\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.output
    assert "BACKEND plain" in done.stdout
    assert "ERROR progress_bar(backend='tqdm') needs tqdm" in done.stdout and "pip install tqdm" in done.stdout


# ---------------------------------------------------------------------------------------------- two ranks
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_ranks_only_rank_zero_shows_progress_and_every_rank_gets_every_item() -> None:
    results = spawn_job("tests.helpers.jobs.loggers:progress_on_ranks", 2, items=7)
    for result in results:
        assert result["seen"] == result["seen_dist"] == list(range(7))
    assert results[0]["out"].startswith("rank 0: 7/7 (100%)") and results[0]["out"].rstrip().endswith("item=6")
    assert results[0]["out_dist"].startswith("7/7 (100%)")
    assert results[1]["out"] == results[1]["out_dist"] == ""
