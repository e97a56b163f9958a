"""The loggers in one process: what Lightning's CSV and TensorBoard loggers do, with Lightning's warnings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from fabric_lite.loggers import CSVLogger, TensorBoardLogger
from fabric_lite.loggers import tensorboard as tensorboard_module
from fabric_lite.loggers.csv_logs import _ExperimentWriter

HAS_A_TENSORBOARD = any(importlib.util.find_spec(name) for name in ("tensorboard", "tensorboardX"))
needs_tensorboard = pytest.mark.skipif(not HAS_A_TENSORBOARD, reason="neither tensorboard nor tensorboardX installed")


# ---------------------------------------------------------------------------------------------------------- CSV
def test_csv_reused_version_folder_warns_and_replaces_the_metrics(tmp_path: Path) -> None:
    previous = tmp_path / "exp" / "version_0" / "metrics.csv"
    previous.parent.mkdir(parents=True)
    previous.write_text("step,old\n0,1\n")
    logger = CSVLogger(root_dir=tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match=r"Experiment logs directory .* exists and is not empty"):
        logger.experiment  # noqa: B018
    assert not previous.exists()


def test_csv_rewrite_with_new_header_keeps_the_rows(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("step,metric1,metric2\n0,1,22\n")
    with mock.patch.object(_ExperimentWriter, "_check_log_dir_exists"):  # keep the file, as when appending
        writer = _ExperimentWriter(log_dir=str(tmp_path))
    writer._rewrite_with_new_header(["step", "metric1", "metric2", "metric3"])
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,metric1,metric2,metric3", "0,1,22,"]


def test_csv_appends_to_a_kept_file(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="test", version=0, flush_logs_every_n_steps=1)
    first.log_metrics({"a": 1, "b": 2})
    first.log_metrics({"a": 3, "b": 4})
    with mock.patch.object(_ExperimentWriter, "_check_log_dir_exists"):
        second = CSVLogger(tmp_path, name="test", version=0, flush_logs_every_n_steps=1)
        second.log_metrics({"a": 100, "b": 200})
    lines = Path(second.experiment.metrics_file_path).read_text().splitlines()
    assert lines == ["a,b,step", "1,2,0", "3,4,0", "100,200,0"]  # every row is a flush point: step 0


# -------------------------------------------------------------------------------------------------- TensorBoard
def test_tensorboard_availability_flags() -> None:
    for flag, package in (
        (tensorboard_module._TENSORBOARD_AVAILABLE, "tensorboard"),
        (tensorboard_module._TENSORBOARDX_AVAILABLE, "tensorboardX"),
    ):
        assert bool(flag) == (importlib.util.find_spec(package) is not None)


@needs_tensorboard
def test_tensorboard_finalize_flushes_and_closes(tmp_path: Path) -> None:
    logger = TensorBoardLogger(root_dir=tmp_path)
    logger.finalize("success")  # nothing logged: no writer is created
    assert logger._experiment is None
    writer = mock.Mock()
    with mock.patch.object(logger, "_writer_module", return_value=mock.Mock(SummaryWriter=lambda **_: writer)):
        logger.log_metrics({"flush_me": 11.1})
        logger.finalize("success")
    assert [c[0] for c in writer.method_calls] == ["add_scalar", "flush", "close"]


class _WithBatchHooks(torch.nn.Module):
    """A module with a LightningModule's batch transfer hooks (recorded), as ``log_graph`` meets one."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.calls: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def _on_before_batch_transfer(self, batch: Any) -> Any:
        self.calls.append("before")
        return batch * 2

    def _apply_batch_transfer_handler(self, batch: Any) -> Any:
        self.calls.append("transfer")
        return batch + 1


@needs_tensorboard
def test_tensorboard_log_graph_applies_a_lightning_modules_batch_hooks(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    logger._experiment = mock.Mock()
    model = _WithBatchHooks()
    x = torch.ones(2, 4)
    logger.log_graph(model, x)
    assert model.calls == ["before", "transfer"]
    traced_model, traced_input = logger._experiment.add_graph.call_args.args
    assert traced_model is model and torch.equal(traced_input, x * 2 + 1)
    plain = torch.nn.Linear(4, 2)
    logger.log_graph(plain, x)
    assert logger._experiment.add_graph.call_args.args == (plain, x)


@needs_tensorboard
@pytest.mark.parametrize(
    ("example", "match"),
    [(None, "`model.example_input_array` is not set"), ({"x": 1}, "can't be traced by TensorBoard")],
)
def test_tensorboard_log_graph_without_a_traceable_input_warns(tmp_path: Path, example: Any, match: str) -> None:
    logger = TensorBoardLogger(tmp_path)
    logger._experiment = mock.Mock()
    model = torch.nn.Linear(4, 2)
    model.example_input_array = example
    with pytest.warns(UserWarning, match=f"Could not log computational graph to TensorBoard: .*{match}"):
        logger.log_graph(model)
    logger._experiment.add_graph.assert_not_called()
