"""``progress_bar`` in one process: plain text lines (no control characters), tqdm on a terminal, disabled bars.

The plain lines show the count, rate, elapsed time, ETA and postfix, also when the loop ends early or is updated by
hand; a bad argument names its value. The tqdm tests need tqdm (the ``test`` extra, installed by ``.ci/setup``;
``pip install tqdm``) and skip without it.

The checks that start processes are in tests/distributed/test_progress.py.
"""

from __future__ import annotations

import importlib.util
import io
import re

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.utilities import ProgressBar, progress_bar

HAS_TQDM = importlib.util.find_spec("tqdm") is not None


NEEDS_TQDM = pytest.mark.skipif(not HAS_TQDM, reason="tqdm is not installed: `pip install tqdm` (or '.[test]')")


CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # anything but "\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def clocked(bar: ProgressBar) -> FakeClock:
    """Drive a plain bar's display with a clock the test moves."""
    clock = FakeClock()
    display = bar._display
    display._clock = clock  # type: ignore[union-attr]
    display.start = display.last_print = clock.now  # type: ignore[union-attr]
    return clock


def test_plain_lines_show_count_rate_elapsed_eta_and_postfix() -> None:
    out = io.StringIO()
    bar = progress_bar(range(100), desc="epoch 1", backend="plain", interval=10.0, file=out)
    assert bar.backend == "plain" and len(bar) == 100
    clock = clocked(bar)
    seen = []
    for item in bar:
        seen.append(item)
        clock.now += 0.5  # two items per second
        bar.set_postfix(loss=torch.tensor(1.0 / (item + 1), requires_grad=True) * 1, lr=0.1, tag="a")
    assert seen == list(range(100))
    lines = out.getvalue().splitlines()
    # a line once 10 s have passed (after the 20th item, and every 20 items after), and the final one
    assert lines[0] == "epoch 1: 20/100 (20%) | 2.00 it/s | elapsed 0:10 | eta 0:40 | loss=0.05, lr=0.1, tag=a"
    assert lines[1].startswith("epoch 1: 40/100 (40%) | 2.00 it/s | elapsed 0:20 | eta 0:30 | loss=0.025")
    assert lines[-1] == "epoch 1: 100/100 (100%) | 2.00 it/s | elapsed 0:50 | loss=0.01, lr=0.1, tag=a"
    assert len(lines) == 5  # 20, 40, 60, 80 and 100: the last periodic line is the final one, not repeated
    assert not CONTROL.search(out.getvalue())


def test_plain_without_total_slow_steps_and_long_runs() -> None:
    out = io.StringIO()
    bar = progress_bar((i for i in range(3)), backend="plain", interval=0, file=out, unit="batch")
    clock = clocked(bar)
    for _ in bar:
        clock.now += 2.5  # slower than one step per second: shown as seconds per step
    assert out.getvalue().splitlines() == [
        "1 batch | 2.50 s/batch | elapsed 0:02",
        "2 batch | 2.50 s/batch | elapsed 0:05",
        "3 batch | 2.50 s/batch | elapsed 0:07",
    ]
    out = io.StringIO()
    bar = ProgressBar(total=10_000, desc="x", backend="plain", interval=3600, file=out)
    clock = clocked(bar)
    clock.now += 3725
    bar.update(5_000)
    bar.close()
    assert out.getvalue() == "x: 5000/10000 (50%) | 1.34 it/s | elapsed 1:02:05 | eta 1:02:05\n"


def test_leaving_the_loop_early_prints_where_it_stopped() -> None:
    out = io.StringIO()
    for item in progress_bar(range(50), desc="eval", backend="plain", interval=1000, file=out):
        if item == 6:
            break
    assert re.fullmatch(
        r"eval: 6/50 \(12%\) \| [\d.]+ (it/s|s/it) \| elapsed \d+:\d\d \| eta \d+:\d\d\n", out.getvalue()
    ), out.getvalue()


def test_manual_updates_in_a_with_block_and_control_characters_are_removed() -> None:
    out = io.StringIO()
    with progress_bar(total=8, desc="a\rb\x1b[31m", backend="plain", interval=0, file=out, unit="sample") as bar:
        bar.update(3)
        bar.set_description("eval\n")
        bar.update(5)
    bar.close()  # idempotent
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["a b [31m: 3/8 (38%)", "eval : 8/8 (100%)"]
    assert not CONTROL.search(out.getvalue())
    with pytest.raises(TypeError, match="no iterable to iterate over"):
        iter(bar).__next__()


def test_disabled_bars_yield_everything_and_write_nothing() -> None:
    out = io.StringIO()
    bar = progress_bar(range(5), disable=True, file=out, backend="tqdm" if HAS_TQDM else "plain")
    assert bar.backend == "off"
    seen = []
    for item in bar:
        seen.append(item)
        bar.set_postfix(item=item)
        bar.set_description("x")
    assert seen == [0, 1, 2, 3, 4] and bar.n == 5 and out.getvalue() == ""


def test_fabric_decides_and_single_process_shows() -> None:
    out = io.StringIO()
    fabric = Fabric(accelerator="cpu", devices=1)
    assert list(progress_bar([1, 2], fabric=fabric, backend="plain", file=out)) == [1, 2]
    assert out.getvalue().startswith("2/2 (100%)")


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"backend='rich'\) is not one of \('auto', 'tqdm', 'plain'\)"):
        progress_bar(range(3), backend="rich")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"interval=-1\) must be a number of seconds >= 0"):
        progress_bar(range(3), interval=-1)
    with pytest.raises(TypeError, match="has no length"):
        len(progress_bar(i for i in range(3)))


# ---------------------------------------------------------------------------------------------- tqdm
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@NEEDS_TQDM
def test_auto_uses_tqdm_on_a_terminal_and_plain_lines_elsewhere() -> None:
    terminal = Terminal()
    bar = progress_bar(range(4), desc="train", file=terminal)
    assert bar.backend == "tqdm"
    for _ in bar:
        bar.set_postfix(loss=torch.tensor(0.25))
    text = terminal.getvalue()
    assert "\r" in text and "train" in text and "4/4" in text and "loss=0.25" in text

    pipe = io.StringIO()  # a log file, a pipe (SLURM output): plain lines even though tqdm is installed
    bar = progress_bar(range(4), desc="train", file=pipe)
    assert bar.backend == "plain"
    list(bar)
    assert pipe.getvalue().startswith("train: 4/4 (100%)") and not CONTROL.search(pipe.getvalue())


@NEEDS_TQDM
def test_tqdm_can_be_forced_and_counts_manual_updates() -> None:
    out = io.StringIO()
    with progress_bar(total=10, backend="tqdm", file=out, desc="eval") as bar:
        bar.update(4)
        bar.update(6)
    assert bar.backend == "tqdm" and bar.n == 10 and "10/10" in out.getvalue()
