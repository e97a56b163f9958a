"""The job of tests/helpers/scripts/resume_anywhere.py, killed at a step and resumed: what
tests/distributed/test_resume_anywhere.py and its Lightning control in tests/compat share."""

from __future__ import annotations

import os
import random
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.harness import REPO, _kill_session, _session_members, base_env

SCRIPT = "tests/helpers/scripts/resume_anywhere.py"
BATCH = 8
STEPS_PER_EPOCH = {1: 24, 2: 12}  # 384 samples, batches of 8, 2 batches a step
EPOCHS = 3
RUN_BOUND = 120  # seconds for one run, on a busy 2-core machine (a run takes 10-25 s there)


def args(devices: int, folder: Path, *extra: str) -> list[str]:
    return [
        SCRIPT,
        "--devices",
        str(devices),
        "--out",
        str(folder / "final.pt"),
        "--checkpoint",
        str(folder / "last.ckpt"),
        *extra,
    ]


def run_and_kill_at(argv: list[str], step: int, timeout: float, python: str | None = None) -> str:
    """Start ``python *argv`` in a new session, wait until it prints ``STEP step``, SIGKILL the whole session and
    return what it printed. Fails when the step does not come within ``timeout`` or a process survives."""
    env = base_env()
    process = subprocess.Popen(
        [python or sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    assert process.stdout is not None
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while f"STEP {step}\n".encode() not in output:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (process.poll() is not None and not select.select([process.stdout], [], [], 0)[0]):
                pytest.fail(f"the job did not reach STEP {step} within {timeout} s:\n{output.decode(errors='replace')}")
            if select.select([process.stdout], [], [], min(remaining, 1.0))[0]:
                chunk = os.read(process.stdout.fileno(), 65536)
                output += chunk
    finally:
        _kill_session(process.pid)
        process.wait(timeout=30)
        process.stdout.close()
    deadline = time.monotonic() + 10
    while _session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _session_members(process.pid), "a process outlived the SIGKILL of its group"
    return output.decode(errors="replace")


def steps(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^STEP (\d+)$", output, re.M)]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two nested checkpoints differ, bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return [] if a.dtype == b.dtype and torch.equal(a, b) else [where]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def kill_step(devices: int, seed: int) -> int:
    """A step to kill at, drawn from ``seed``: an even one (the job saves at every even step), whose checkpoint
    (that step's or, if the kill lands in the save, the one before) falls inside an epoch."""
    per_epoch = STEPS_PER_EPOCH[devices]
    choices = [s for s in range(4, per_epoch * EPOCHS - 2, 2) if s % per_epoch not in (0, 2)]
    return random.Random(seed).choice(choices)
