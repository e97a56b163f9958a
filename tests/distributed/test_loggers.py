"""Loggers and callbacks: ``Fabric(loggers=..., callbacks=...)``, ``fabric.log``/``log_dict``/``call``, and the
built-in ``CSVLogger`` and ``TensorBoardLogger`` (folder layout, versions, file contents, rank 0 alone writing).

The TensorBoard tests that write real event files need ``tensorboardX`` (the ``test`` extra, installed by
``.ci/setup``) or ``tensorboard`` (``pip install tensorboard``: the ``torch.utils.tensorboard`` path); each skips
with that reason when its package is missing.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import pickle
import struct
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.loggers import CSVLogger, Logger, TensorBoardLogger
from tests.helpers.harness import lightning_python, run_python, spawn_job

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_TENSORBOARDX = importlib.util.find_spec("tensorboardX") is not None
NEEDS_A_WRITER = pytest.mark.skipif(
    not (HAS_TENSORBOARD or HAS_TENSORBOARDX),
    reason="neither tensorboardX nor tensorboard is installed: `pip install -e '.[test]'` or `pip install tensorboard`",
)


def read_csv(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# ---------------------------------------------------------------------------------------------- CSVLogger
def test_csv_layout_and_contents(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    assert logger.name == "lightning_logs" and logger.root_dir == str(tmp_path) == logger.save_dir
    assert not (tmp_path / "lightning_logs").exists()  # nothing is created before the first row
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25})
    logger.log_metrics({"loss": 0.25})
    logger.log_metrics({"loss": 0.125, "lr": 1e-3}, step=10)
    logger.log_metrics({"loss": 0.0625})
    assert not (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").exists()  # buffered
    logger.finalize("success")
    assert logger.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text() == (
        "acc,loss,lr,step\n0.25,0.5,,0\n,0.25,,1\n,0.125,0.001,10\n,0.0625,,3\n"
    )
    assert os.listdir(tmp_path / "lightning_logs" / "version_0") == ["metrics.csv"]


def test_csv_flushes_every_n_rows_and_rewrites_the_header_for_new_names(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="exp", version=0, flush_logs_every_n_steps=2)
    path = tmp_path / "exp" / "version_0" / "metrics.csv"
    logger.log_metrics({"a": 1}, step=0)
    assert not path.exists()
    logger.log_metrics({"a": 2}, step=5)
    assert path.read_text() == "a,step\n1,0\n2,5\n"
    logger.log_metrics({"b": 3}, step=6)
    logger.log_metrics({"a": 4, "b": 5}, step=7)  # second row of the batch: flush, with a new header
    assert path.read_text() == "a,b,step\n1,,0\n2,,5\n,3,6\n4,5,7\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the rewrite keeps an ordinary file mode
    assert sorted(os.listdir(path.parent)) == ["metrics.csv"]  # no temporary file left behind
    logger.save()  # nothing buffered: no change
    assert path.read_text().count("\n") == 5


def test_csv_rows_without_a_step_get_lightnings_step(tmp_path: Path) -> None:
    """Without ``step=``, Lightning's CSVLogger writes the number of rows it has buffered since its last flush (at a
    row whose ``step + 1`` is a multiple of ``flush_logs_every_n_steps``, or at ``save()``): the same numbers here,
    so that the same script writes the same file (tests/helpers/scripts/logger_layout.py compares the bytes)."""
    logger = CSVLogger(tmp_path, name="auto", version=0, flush_logs_every_n_steps=2)
    for value in range(5):
        logger.log_metrics({"v": value})
    logger.log_metrics({"v": 5}, step=9)
    logger.log_metrics({"v": 6})
    logger.save()
    logger.log_metrics({"v": 7})
    logger.finalize("success")
    _, rows = read_csv(tmp_path / "auto" / "version_0" / "metrics.csv")
    assert [(r["v"], r["step"]) for r in rows] == [
        ("0", "0"),
        ("1", "1"),
        ("2", "0"),
        ("3", "1"),
        ("4", "0"),
        ("5", "9"),
        ("6", "0"),
        ("7", "0"),
    ]


def test_csv_buffer_is_bounded_when_steps_never_end_a_flush_period(tmp_path: Path) -> None:
    """Steps 0, 2, 4, ... never make ``step + 1`` a multiple of 2: Lightning's buffer grows until the end; here the
    rows are written every ``flush_logs_every_n_steps`` rows all the same."""
    logger = CSVLogger(tmp_path, name="even", version=0, flush_logs_every_n_steps=2)
    path = tmp_path / "even" / "version_0" / "metrics.csv"
    logger.log_metrics({"v": 0}, step=0)
    assert not path.exists()
    logger.log_metrics({"v": 1}, step=2)
    assert path.read_text() == "step,v\n0,0\n2,1\n"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_csv_prefix_and_name_none_and_str_version(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name=None, version="run-a", prefix="train")
    logger.log_metrics({"loss": 1.5}, step=0)
    logger.finalize("success")
    assert logger.log_dir == str(tmp_path / "run-a")
    assert (tmp_path / "run-a" / "metrics.csv").read_text() == "step,train-loss\n0,1.5\n"


def test_versioning_scans_existing_folders(tmp_path: Path) -> None:
    root = tmp_path / "lightning_logs"
    for name in ("version_0", "version_1", "version_x", "other"):
        (root / name).mkdir(parents=True)
    (root / "version_9").write_text("a file, not a version folder")
    logger = CSVLogger(tmp_path)
    assert logger.version == 2
    logger.log_metrics({"x": 1})
    logger.save()
    assert logger.version == 2 and logger.log_dir == str(root / "version_2")  # chosen once, kept
    assert CSVLogger(tmp_path).version == 3
    assert CSVLogger(tmp_path, name="fresh").version == 0
    assert CSVLogger(tmp_path, version=5).log_dir == str(root / "version_5")
    assert CSVLogger(tmp_path, version="best").log_dir == str(root / "best")


def test_existing_version_folder_warns_and_replaces_old_metrics(tmp_path: Path) -> None:
    folder = tmp_path / "lightning_logs" / "version_0"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("old,step\n1,0\n")
    logger = CSVLogger(tmp_path, version=0)
    with pytest.warns(UserWarning, match="exists and is not empty"):
        logger.log_metrics({"new": 2}, step=0)
    logger.finalize("success")
    assert (folder / "metrics.csv").read_text() == "new,step\n2,0\n"


def test_csv_rejects_bad_arguments_with_the_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"flush_logs_every_n_steps=0\) must be >= 1"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)
    with pytest.raises(TypeError, match=r"version=1.5\).*int.*str.*None"):
        CSVLogger(tmp_path, version=1.5)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"'foo://bucket/logs' cannot be opened"
    ):  # URLs: tests/distributed/test_remote.py
        CSVLogger("foo://bucket/logs")
    logger = CSVLogger(tmp_path)
    with pytest.raises(ValueError, match=r"'w' is a tensor with 3 elements \(shape \(3,\)\)"):
        logger.log_metrics({"w": torch.ones(3)})
    with pytest.raises(NotImplementedError, match="does not record hyperparameters"):
        logger.log_hyperparams({"lr": 0.1})  # as in Lightning Fabric
    assert not (tmp_path / "lightning_logs").exists()


def test_csv_rows_are_written_at_exit_without_finalize(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fabric_lite import Fabric\n"
        "from fabric_lite.loggers import CSVLogger\n"
        "fabric = Fabric(accelerator='cpu', devices=1, loggers=CSVLogger(sys.argv[1]))\n"
        "for step in range(3):\n"
        "    fabric.log('loss', 1.0 / (step + 1), step=step)\n"
    )
    done = run_python(["-c", code, str(tmp_path)], timeout=60)
    assert done.returncode == 0, done.output
    header, rows = read_csv(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    assert header == ["loss", "step"] and [r["loss"] for r in rows] == ["1.0", "0.5", "0.3333333333333333"]


def test_a_logger_pickles_without_its_open_writer(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=10)
    logger.log_metrics({"a": 1}, step=0)
    copy = pickle.loads(pickle.dumps(logger))  # what ddp_spawn does with the loggers given to Fabric
    assert copy.log_dir == logger.log_dir and copy._experiment is None
    logger.finalize("success")
    assert (Path(logger.log_dir) / "metrics.csv").read_text() == "a,step\n1,0\n"


# ---------------------------------------------------------------------------------------------- Fabric API
class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, int | None]] = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((metrics, step))


def test_fabric_log_and_log_dict_reach_every_logger_as_numbers() -> None:
    first, second = Recorder(), Recorder()
    fabric = Fabric(accelerator="cpu", devices=1, loggers=(first, second))  # a tuple is a list of loggers too
    assert fabric.loggers == [first, second] and fabric.logger is first
    fabric.log("loss", torch.tensor([0.5], requires_grad=True) * 1, step=3)
    fabric.log_dict({"acc": torch.tensor(1, dtype=torch.int64), "group": {"a": torch.tensor(2.5)}, "lr": 0.1})
    for logger in (first, second):
        assert logger.calls == [({"loss": 0.5}, 3), ({"acc": 1, "group": {"a": 2.5}, "lr": 0.1}, None)]
        assert type(logger.calls[0][0]["loss"]) is float and type(logger.calls[1][0]["acc"]) is int


def test_fabric_log_errors_name_the_value() -> None:
    recorder = Recorder()
    fabric = Fabric(accelerator="cpu", devices=1, loggers=recorder)
    with pytest.raises(
        ValueError, match=r"fabric.log_dict: the metric 'w' is a tensor with 4 elements \(shape \(2, 2\)"
    ):
        fabric.log("w", torch.ones(2, 2))
    with pytest.raises(TypeError, match=r"expects a dict of metric names to values.*got list"):
        fabric.log_dict([("loss", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expects a str name, got 3"):
        fabric.log(3, 1.0)  # type: ignore[arg-type]
    assert recorder.calls == []
    Fabric(accelerator="cpu", devices=1).log("loss", 1.0)  # no logger: nothing to do, no error


def test_fabric_rejects_objects_that_are_not_loggers() -> None:
    with pytest.raises(TypeError, match=r"got 'logs' \(str\) at position 0, which has no log_metrics"):
        Fabric(accelerator="cpu", devices=1, loggers="logs")
    with pytest.raises(TypeError, match=r"at position 1, which has no log_metrics"):
        Fabric(accelerator="cpu", devices=1, loggers=[Recorder(), object()])
    with pytest.raises(TypeError, match=r"got the class CSVLogger at position 0; pass an instance"):
        Fabric(accelerator="cpu", devices=1, loggers=CSVLogger)
    with pytest.raises(IndexError, match="no logger"):
        _ = Fabric(accelerator="cpu", devices=1).logger


def test_custom_logger_subclass(tmp_path: Path) -> None:
    class MyLogger(Logger):
        def __init__(self) -> None:
            self.rows: list = []

        @property
        def name(self):
            return "mine"

        @property
        def version(self):
            return 0

        def log_metrics(self, metrics, step=None):
            self.rows.append((metrics, step))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Logger()  # type: ignore[abstract]
    logger = MyLogger()
    assert logger.root_dir is None and logger.log_dir is None and logger.group_separator == "/"
    fabric = Fabric(accelerator="cpu", devices=1, loggers=logger)
    fabric.launch(lambda fabric: fabric.log("x", 1))
    assert logger.rows == [({"x": 1}, None)]


def test_launch_finalizes_the_loggers_when_the_function_ends(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    fabric = Fabric(accelerator="cpu", devices=1, loggers=logger)

    def train(fabric: Fabric) -> None:
        fabric.log("loss", 1.0, step=0)

    fabric.launch(train)
    assert (Path(logger.log_dir) / "metrics.csv").read_text() == "loss,step\n1.0,0\n"

    def crash(fabric: Fabric) -> None:
        fabric.log("loss", 2.0, step=1)
        raise RuntimeError("boom")

    fabric = Fabric(accelerator="cpu", devices=1, loggers=logger)
    with pytest.raises(RuntimeError, match="boom"):
        fabric.launch(crash)
    assert (Path(logger.log_dir) / "metrics.csv").read_text() == "loss,step\n1.0,0\n2.0,1\n"  # kept on failure


# ---------------------------------------------------------------------------------------------- fabric.call
def test_call_passes_each_callback_only_the_keywords_it_takes() -> None:
    seen: list = []

    class Named:
        def on_step(self, loss):
            seen.append(("named", loss))

    class TakesAll:
        def on_step(self, **kwargs):
            seen.append(("all", kwargs))

    class Positional:
        def on_step(self, first, loss=None):
            seen.append(("positional", first, loss))

    class KeywordOnly:
        def on_step(self, *, step):
            seen.append(("keyword-only", step))

    class Without:
        pass

    class NotCallable:
        on_step = 3

    class NoneHook:
        on_step = None

    callbacks = [Named(), TakesAll(), Without(), NoneHook(), KeywordOnly()]
    fabric = Fabric(accelerator="cpu", devices=1, callbacks=callbacks)
    fabric.call("on_step", loss=0.5, step=7)
    assert seen == [("named", 0.5), ("all", {"loss": 0.5, "step": 7}), ("keyword-only", 7)]

    seen.clear()
    Fabric(accelerator="cpu", devices=1, callbacks=Positional()).call("on_step", "x", loss=1.0, step=2)
    assert seen == [("positional", "x", 1.0)]

    with pytest.warns(UserWarning, match=r"Skipping the callback `NotCallable.on_step` because it is not callable"):
        Fabric(accelerator="cpu", devices=1, callbacks=[NotCallable()]).call("on_step", loss=1.0)


def test_call_names_the_callback_whose_signature_does_not_fit() -> None:
    class NoArgs:
        def on_epoch_end(self):
            pass

    class Raises:
        def on_epoch_end(self, results):
            raise TypeError("a bug inside the callback")

    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[NoArgs()])
    with pytest.raises(TypeError, match=r"cannot call NoArgs.on_epoch_end\(\) with 1 positional argument.*by keyword"):
        fabric.call("on_epoch_end", {"loss": 1.0})
    fabric.call("on_epoch_end", results={"loss": 1.0})  # by keyword: filtered out, no error
    # a TypeError raised inside a callback is the callback's own, not reported as a signature mismatch
    with pytest.raises(TypeError, match=r"^a bug inside the callback$"):
        Fabric(accelerator="cpu", devices=1, callbacks=Raises()).call("on_epoch_end", results={})
    with pytest.raises(TypeError, match=r"got the class NoArgs at position 0; pass an instance"):
        Fabric(accelerator="cpu", devices=1, callbacks=[NoArgs])


def test_setup_calls_on_after_setup() -> None:
    seen = []

    class Hook:
        def on_after_setup(self, module):
            seen.append(type(module).__name__)

    fabric = Fabric(accelerator="cpu", devices=1, callbacks=Hook())
    fabric.setup(torch.nn.Linear(2, 2))
    assert seen == ["_FabricModule"]


# ---------------------------------------------------------------------------------------------- TensorBoardLogger
def read_events(log_dir: str | Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """The scalars ``{tag: [(step, value), ...]}`` and every tag in the event files of ``log_dir`` (the TFRecord
    framing: 8-byte length, 4-byte CRC, the Event message, 4-byte CRC)."""
    if HAS_TENSORBOARDX:
        from tensorboardX.proto.event_pb2 import Event
    else:
        from tensorboard.compat.proto.event_pb2 import Event
    scalars: dict[str, list[tuple[int, float]]] = {}
    tags: set[str] = set()
    for name in sorted(os.listdir(log_dir)):
        if not name.startswith("events.out.tfevents"):
            continue
        data = Path(log_dir, name).read_bytes()
        position = 0
        while position < len(data):
            (length,) = struct.unpack("<Q", data[position : position + 8])
            event = Event.FromString(data[position + 12 : position + 12 + length])
            position += 12 + length + 4
            for value in event.summary.value:
                tags.add(value.tag)
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars, tags


WRITERS = [
    pytest.param(
        "tensorboard",
        marks=pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed: `pip install tensorboard`"),
        id="torch.utils.tensorboard",
    ),
    pytest.param(
        "tensorboardX",
        marks=pytest.mark.skipif(
            not HAS_TENSORBOARDX, reason="tensorboardX is not installed: `pip install tensorboardX`"
        ),
        id="tensorboardX",
    ),
]


@pytest.mark.parametrize("writer", WRITERS)
def test_tensorboard_writes_real_event_files(tmp_path: Path, writer: str) -> None:
    (tmp_path / "tb" / "version_0").mkdir(parents=True)
    logger = TensorBoardLogger(tmp_path, name="tb", prefix="train", sub_dir="fit")
    logger._backend = writer  # type: ignore[assignment]  # the package that writes the events
    fabric = Fabric(accelerator="cpu", devices=1, loggers=logger)
    fabric.log("loss", torch.tensor(0.5), step=0)
    fabric.log_dict({"loss": 0.25, "acc": torch.tensor(0.75)}, step=1)
    fabric.log_dict({"pair": {"a": 1.0, "b": torch.tensor(2.0)}}, step=2)
    logger.log_hyperparams(Namespace(lr=0.1, model={"layers": 2, "act": torch.nn.ReLU}, tags=[1, 2]))
    with pytest.raises(ValueError, match=r"cannot log train-name='text' \(str\)"):
        logger.log_metrics({"name": "text"}, step=3)
    logger.finalize("success")
    assert logger.version == 1 and logger.log_dir == str(tmp_path / "tb" / "version_1" / "fit")
    files = os.listdir(logger.log_dir)
    assert any(name.startswith("events.out.tfevents") for name in files), files
    scalars, tags = read_events(logger.log_dir)
    assert scalars["train-loss"] == [(0, 0.5), (1, 0.25)]
    assert scalars["train-acc"] == [(1, 0.75)]
    assert scalars["train-hp_metric"] == [(0, -1.0)]  # default_hp_metric
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= tags
    # a dict value is a group of scalars: one sub-folder per member, as add_scalars writes them (torch names it
    # `train-pair_a`, tensorboardX `train-pair/a`)
    groups = {
        os.path.relpath(sub, logger.log_dir).replace(os.sep, "_"): read_events(sub)[0]
        for sub, _, names in os.walk(logger.log_dir)
        if sub != logger.log_dir and any(name.startswith("events.out.tfevents") for name in names)
    }
    assert groups == {"train-pair_a": {"train-pair": [(2, 1.0)]}, "train-pair_b": {"train-pair": [(2, 2.0)]}}
    # logging after finalize goes on in a new event file of the same folder, and the first one stays whole
    logger.log_metrics({"late": 1.0}, step=9)
    logger.finalize("success")
    scalars = read_events(logger.log_dir)[0]
    assert scalars["train-late"] == [(9, 1.0)] and scalars["train-loss"] == [(0, 0.5), (1, 0.25)]


@NEEDS_A_WRITER
def test_tensorboard_writes_at_exit_without_finalize(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fabric_lite.loggers import TensorBoardLogger\n"
        "logger = TensorBoardLogger(sys.argv[1], version='run', flush_secs=3600, max_queue=1000)\n"
        "for step in range(3):\n"
        "    logger.log_metrics({'loss': float(step)}, step=step)\n"
    )
    done = run_python(["-c", code, str(tmp_path)], timeout=60)
    assert done.returncode == 0, done.output
    assert read_events(tmp_path / "lightning_logs" / "run")[0]["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_tensorboard_missing_says_what_to_install() -> None:
    # a None entry in sys.modules makes a package unimportable, as if it were not installed
    code = (
        "import sys\n"
        "sys.modules['tensorboard'] = sys.modules['tensorboardX'] = None\n"
        "from fabric_lite.loggers import TensorBoardLogger, CSVLogger\n"
        "try:\n"
        "    TensorBoardLogger('logs')\n"
        "except ModuleNotFoundError as err:\n"
        "    print('ERROR', err)\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.output
    assert "ERROR TensorBoardLogger needs the `tensorboard` package (or `tensorboardX`)" in done.stdout
    assert "pip install tensorboard" in done.stdout and "fabric-lite[tensorboard]" in done.stdout


def test_importing_the_loggers_imports_no_tensorboard() -> None:
    code = (
        "import sys, fabric_lite.loggers\n"
        "from fabric_lite.loggers import TensorBoardLogger\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tensorboard', 'torch.utils.tensorboard'))))\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.output


# ---------------------------------------------------------------------------------------------- two ranks
@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_fork"])
def test_two_ranks_rank_zero_writes_and_every_rank_agrees_on_the_version(tmp_path: Path, strategy: str) -> None:
    """Rank-dependent values logged on both ranks; only rank 0's reach the file (and a logger Fabric does not
    know); both ranks name the version folder rank 0 chose; the last row is written without any flush call (at
    exit for ``ddp``, at the end of the launched function for ``ddp_fork``, whose processes skip exit hooks)."""
    for existing in ("version_0", "version_1"):
        (tmp_path / "exp" / existing).mkdir(parents=True)
    done = run_python(["tests/helpers/scripts/logging_script.py", str(tmp_path), strategy], timeout=120)
    assert done.returncode == 0, done.output
    results = [json.loads((tmp_path / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1], done.output
    expected_dir = str(tmp_path / "exp" / "version_2")
    assert [r["log_dir"] for r in results] == [expected_dir, expected_dir]
    assert sorted(os.listdir(tmp_path / "exp")) == ["version_0", "version_1", "version_2"]
    header, rows = read_csv(tmp_path / "exp" / "version_2" / "metrics.csv")
    assert header == ["final", "late", "rank_value", "step", "step_sq"]
    assert rows == [
        {"final": "", "late": "", "rank_value": "0.0", "step": "0", "step_sq": "0"},
        {"final": "", "late": "", "rank_value": "1.0", "step": "1", "step_sq": "1"},
        {"final": "", "late": "", "rank_value": "2.0", "step": "2", "step_sq": "4"},
        {"final": "", "late": "0.5", "rank_value": "", "step": "3", "step_sq": ""},
        {"final": "1", "late": "", "rank_value": "", "step": "4", "step_sq": ""},
    ]
    assert len(results[0]["recorder"]) == 5 and results[1]["recorder"] == []
    assert results[0]["hook"] == results[1]["hook"] == [1]  # fabric.call runs on every rank


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_ranks_loggers_used_directly_write_on_rank_zero_only(tmp_path: Path) -> None:
    results = spawn_job(
        "tests.helpers.jobs.loggers:standalone_loggers", 2, root=str(tmp_path), tensorboard=HAS_TENSORBOARDX
    )
    assert [r["rank"] for r in results] == [0, 1]
    loggers = 2 if HAS_TENSORBOARDX else 1
    assert results[0]["dummy_experiment"] == [False] * loggers and results[1]["dummy_experiment"] == [True] * loggers
    assert results[0]["log_dirs"] == results[1]["log_dirs"]
    assert (tmp_path / "csv" / "version_0" / "metrics.csv").read_text() == "step,value\n0,0.0\n1,1.0\n"
    files = results[1]["files"]
    assert files[0] == os.path.join("csv", "version_0", "metrics.csv")
    assert len(files) == loggers  # one events file from rank 0, nothing from rank 1
    if HAS_TENSORBOARDX:
        assert read_events(tmp_path / "tb" / "version_0")[0]["value"] == [(0, 0.0), (1, 1.0)]


# ---------------------------------------------------------------------------------------------- Lightning
@pytest.mark.compat
@pytest.mark.skipif(
    lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)"
)
def test_csv_logger_writes_what_lightnings_writes(tmp_path: Path) -> None:
    """Same folders, versions, file names and metrics.csv bytes as Lightning Fabric's CSVLogger."""
    layouts = {}
    for impl, python in (("lightning", lightning_python()), ("fabric_lite", None)):
        root = tmp_path / impl
        done = run_python(["tests/helpers/scripts/logger_layout.py", impl, str(root)], timeout=90, python=python)
        assert done.returncode == 0, done.output
        lines = [line for line in done.stdout.splitlines() if line.startswith("LAYOUT ")]
        assert len(lines) == 1, done.output
        layouts[impl] = json.loads(lines[0][len("LAYOUT ") :])
    assert layouts["fabric_lite"] == layouts["lightning"]
    assert layouts["fabric_lite"]["seen"]["a"] == [4, os.path.join("lightning_logs", "version_4")]


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("runner", ["cli", "torchrun"])
def test_a_logger_on_rank_zero_only_does_not_hang_the_job(tmp_path: Path, runner: str) -> None:
    """Ranks built with different loggers all take part in agreeing on the version folder (a collective that only
    the ranks holding a logger joined hung the job until the timeout)."""
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    script = ["tests/helpers/scripts/logger_on_rank_zero_only.py", str(tmp_path), runner]
    if runner == "cli":
        args = ["-m", "fabric_lite", "run", "--accelerator=cpu", "--devices=2", "--strategy=ddp", *script]
    else:
        args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script]
    done = run_python(args, timeout=120)
    assert done.returncode == 0, done.output
    results = [json.loads((tmp_path / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["total"] for r in results] == [3.0, 3.0]
    assert results[0]["log_dir"] == str(tmp_path / "lightning_logs" / "version_1") and results[1]["log_dir"] is None
    _, rows = read_csv(tmp_path / "lightning_logs" / "version_1" / "metrics.csv")
    assert rows == [{"step": "0", "total": "3.0"}]
