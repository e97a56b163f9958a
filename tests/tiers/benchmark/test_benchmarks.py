"""The benchmarks work: their quick modes run, print every figure and write what they promise.

Smoke tests only: nothing about speed or memory is asserted (the figures of a quick run on a shared CI machine mean
little). Lightning Fabric and Accelerate are part of the run when ``.venv-lightning`` (or ``$LIGHTNING_PYTHON``)
has them. An optional tier, as the benchmarks themselves are: the quick runs cost about 8 minutes of CPU, a quarter
of CI's time budget, so the whole suite skips them and says how to run them:

    .venv/bin/python -m pytest -q -m benchmark     # the tier alone (or FABRIC_LITE_BENCHMARKS=1 in the whole suite)
"""

from __future__ import annotations

import json
import math
import struct
from datetime import datetime
from pathlib import Path

import pytest
import torch

from tests.helpers.harness import lightning_python, optional_tier_skipped, run_python

pytestmark = pytest.mark.benchmark


@pytest.fixture(autouse=True)
def _asked_for(request: pytest.FixtureRequest) -> None:
    reason = optional_tier_skipped(request.config, "benchmark", "FABRIC_LITE_BENCHMARKS", "test_benchmarks.py")
    if reason:
        pytest.skip(reason)


FIGURES = [
    "import",
    "startup/first_all_reduce",
    "step/tiny",
    "step/mlp",
    "ddp_step/tiny",
    "ddp_step/mlp",
    "all_reduce/dict64",
    "all_reduce/scalar",
    "all_reduce/dict64x8",
    "sweep/4B",
    "sweep/64KiB",
    "sweep3/4B",
    "sweep3/64KiB",
    "broadcast/tensor1k",
    "broadcast/tensor4M",
    "memory/tensor_peak",
    "memory/rss_peak",
    "async_save/ddp_blocked",
    "async_save/ddp_step_during_write",
    "async_save/fsdp_blocked",
    "async_save/fsdp_step_during_write",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE, data[:16]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])  # type: ignore[return-value]


# The quick run takes about 55 s alone on 2 cores, and more than 240 s beside the rest of the suite under `-n 2`
# (every tier on): the bound guards against a hang, so it covers the busy machine.
@pytest.mark.timeout(660)
def test_run_quick_prints_every_figure_and_writes_json_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = run_python(["benchmarks/run.py", "--quick", "--out", str(out)], timeout=600)
    assert done.returncode == 0, done.output
    for figure in FIGURES:
        assert f"\n{figure} " in done.stdout, f"{figure} missing from the table\n{done.output}"

    record = json.loads(out.read_text())
    assert record["quick"] is True
    assert record["torch"] == torch.__version__
    assert datetime.fromisoformat(record["date"]).tzinfo is not None
    assert {"platform", "processor", "cpus", "python"} <= set(record["machine"])
    impls = ["fabric_lite"] + (["lightning", "accelerate"] if lightning_python() else [])
    found = {(row["measure"], row["impl"]) for row in record["results"]}
    for figure in FIGURES:
        assert (figure, "fabric_lite") in found, figure
    for impl in impls:
        assert ("step/tiny", impl) in found and ("memory/tensor_peak", impl) in found, impl
    for row in record["results"]:
        assert row["median"] > 0, row
        if row["measure"] != "import":
            assert row["raw"] > 0 and row["ratio"] > 0 and row["low"] <= row["ratio"] <= row["high"], row

    png = out.with_suffix(".png").read_bytes()
    width, height = _png_size(png)
    rows_with_ratio = sum(1 for row in record["results"] if row["ratio"] is not None)
    assert 600 <= width <= 4000 and 10 * rows_with_ratio <= height <= 6000, (width, height)
    assert len(png) > 2000  # bars and text, not an empty image


@pytest.mark.timeout(300)
def test_gpu_benchmark_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    # four variants in processes of their own, two of them under torchrun: 30-60 s here, over 90 s on a busy CI
    done = run_python(["benchmarks/bench_gpu.py", "--device", "cpu", "--quick", "--out", str(out)], timeout=270)
    assert done.returncode == 0, done.output
    assert "device: CPU" in done.stdout, done.output
    record = json.loads(out.read_text())
    assert {"raw", "fabric_lite", "raw_ddp", "fabric_lite_ddp"} <= set(record["variants"])
    for name, runs in record["variants"].items():
        assert len(runs) == 1 and runs[0]["step_s"] > 0, name
        # same seed, same batch, same precision: every variant trains the same model to the same loss
        assert runs[0]["loss"] == pytest.approx(record["variants"]["raw"][0]["loss"], rel=1e-2), name
    assert {row["measure"] for row in record["results"]} == {"gpu_step/1_device", "gpu_step/ddp_ws1"}
    _png_size(out.with_suffix(".png").read_bytes())


@pytest.mark.timeout(180)
def test_fsdp_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "fsdp.json"
    done = run_python(["benchmarks/bench_fsdp.py", "--quick", "--out", str(out)], timeout=150)
    assert done.returncode == 0, done.output
    assert "fsdp/ddp" in done.stdout and "fsdp/raw_fsdp" in done.stdout and "rss_peak" in done.stdout, done.output
    record = json.loads(out.read_text())
    for table in ("cpu", "cpu_raw"):
        assert {(row["figure"], row["rank"]) for row in record[table]} == {
            (figure, rank) for figure in ("rss_peak", "step") for rank in (0, 1)
        }
        for row in record[table]:
            assert all(value > 0 for value in row["medians"].values()), row
    ddp, fsdp, raw = (record["cpu_runs"][v][0] for v in ("ddp", "fsdp", "raw_fsdp"))
    # same seed: the meta-device model is initialised as the eager one, so both train to the same loss; sharded by
    # hand, the shards are initialised by DTensor's own random generator (other values, the same model)
    for rank in (0, 1):
        assert fsdp[rank]["loss"] == pytest.approx(ddp[rank]["loss"], rel=1e-4)
        assert raw[rank]["params"] == fsdp[rank]["params"] and math.isfinite(raw[rank]["loss"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", [[], ["--pipeline"]], ids=["tp_fsdp", "pipeline"])
def test_model_parallel_benchmark_quick(tmp_path: Path, layout: list[str]) -> None:
    out = tmp_path / "model_parallel.json"
    done = run_python(["benchmarks/bench_model_parallel.py", "--quick", *layout, "--out", str(out)], timeout=270)
    assert done.returncode == 0, done.output
    assert "fabric_lite/raw" in done.stdout and "rss_peak" in done.stdout, done.output
    record = json.loads(out.read_text())
    assert {(row["figure"], row["rank"]) for row in record["table"]} == {
        (figure, rank) for figure in ("step", "rss_peak") for rank in range(4)
    }
    for row in record["table"]:
        assert all(value > 0 for value in row["medians"].values()) and row["ratio"] > 0, row
    # the same start and the same batches in the same processes: both implementations train to the same loss (with
    # a pipeline, the hand-written loop has it on the last stage's ranks only)
    rows = [row for row in record["time_runs"] if not layout or row["rank"] >= 2]
    for row in rows:
        assert row["loss"]["fabric_lite"] == pytest.approx(row["loss"]["raw"], rel=1e-4), row
    # the same parallelize function: every rank holds shards of the same size under both
    raw, fabric = record["memory_runs"]["raw"][0], record["memory_runs"]["fabric_lite"][0]
    assert [r["local_params"] for r in fabric] == [r["local_params"] for r in raw], (raw, fabric)
