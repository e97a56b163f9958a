"""``strategy="dp"`` (``DataParallelStrategy``): its methods on CPU tensors, the plan, the CPU fallback compared with
Lightning Fabric, and (marked ``cuda``) a training loop on a GPU.

Without CUDA, ``DataParallel`` calls the module directly, so everything but the replication itself runs here.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fabric_lite import Fabric
from fabric_lite._plan import Machine, resolve_plan
from fabric_lite.strategies import DataParallelStrategy, DDPStrategy
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.utilities.exceptions import InvalidReduceOpError
from tests.helpers.harness import lightning_python, run_python

CPU = torch.device("cpu")


def strategy() -> DataParallelStrategy:
    return DataParallelStrategy(parallel_devices=[CPU])


# ------------------------------------------------------------------------------------ all_reduce


@pytest.mark.parametrize(
    ("values", "reduce_op", "expected"),
    [
        pytest.param([1.0, 3.0], "mean", 2.0, id="mean"),
        pytest.param([1.0, 3.0], "avg", 2.0, id="avg"),
        pytest.param([1.0, 3.0], dist.ReduceOp.AVG, 2.0, id="ReduceOp.AVG"),
        pytest.param([1.0, 3.0], "sum", 4.0, id="sum"),
        pytest.param([1.0, 3.0], dist.ReduceOp.SUM, 4.0, id="ReduceOp.SUM"),
        pytest.param([1.0, 3.0], None, 4.0, id="None-is-sum"),
        pytest.param([1.0, 3.0, -2.0], "max", 3.0, id="max"),
        pytest.param([1.0, 3.0, -2.0], "MIN", -2.0, id="min-upper-case"),
        pytest.param([2.0, 3.0, 0.5], "product", 3.0, id="product"),
        pytest.param([2.0, 3.0, 0.5], "prod", 3.0, id="prod"),
    ],
)
def test_all_reduce_honours_reduce_op(values: list[float], reduce_op: Any, expected: float) -> None:
    result = strategy().all_reduce(torch.tensor(values), reduce_op=reduce_op)
    assert result.shape == () and result.dtype == torch.float32
    assert result.item() == pytest.approx(expected)


def test_all_reduce_default_is_mean() -> None:
    assert strategy().all_reduce(torch.tensor([[1.0, 2.0], [3.0, 6.0]])).item() == 3.0


_INTEGER_CASES = [
    ([1, 4], "mean", 2),  # truncated
    ([-1, -4], "mean", -2),  # toward zero
    ([1, 4], "sum", 5),
    ([7, 4], "max", 7),
    ([7, 4], "product", 28),
]


@pytest.mark.parametrize(
    ("values", "reduce_op", "expected", "dtype"),
    [
        pytest.param(values, op, expected, dtype, id=f"{op}-{values}-{dtype}")
        for values, op, expected in _INTEGER_CASES
        for dtype in (torch.int32, torch.int64, torch.uint8)
        if min(values) >= 0 or dtype.is_signed
    ],
)
def test_all_reduce_integers_keep_their_dtype(values: list[int], reduce_op: str, expected: int, dtype: Any) -> None:
    result = strategy().all_reduce(torch.tensor(values, dtype=dtype), reduce_op=reduce_op)
    assert (result.item(), result.dtype) == (expected, dtype)


def test_all_reduce_exact_integer_mean_beyond_float32() -> None:
    big = 2**40 + 1
    assert strategy().all_reduce(torch.tensor([big, big], dtype=torch.int64)).item() == big


@pytest.mark.parametrize(
    ("reduce_op", "expected"),
    [("sum", True), ("mean", True), ("max", True), ("product", False), ("min", False)],
)
def test_all_reduce_booleans_mean_any_or_all(reduce_op: str, expected: bool) -> None:
    result = strategy().all_reduce(torch.tensor([True, False]), reduce_op=reduce_op)
    assert (result.item(), result.dtype) == (expected, torch.bool)


def test_all_reduce_collection_keeps_structure_and_other_leaves() -> None:
    loss = torch.tensor([1.0, 3.0])
    data = {"loss": loss, "nested": [torch.tensor([2, 4, 9]), "name"], "n": 5}
    result = strategy().all_reduce(data, reduce_op="sum")
    assert result["loss"].item() == 4.0 and result["nested"][0].item() == 15
    assert result["nested"][1] == "name" and result["n"] == 5
    assert loss.tolist() == [1.0, 3.0]  # not in place: the per-replica values are still there


def test_fabric_all_reduce_of_a_collection_goes_through_the_strategy() -> None:
    fabric = Fabric(accelerator="cpu", strategy=DataParallelStrategy())
    result = fabric.all_reduce({"loss": torch.tensor([1.0, 3.0]), "n": 3, "tag": "x"}, reduce_op="sum")
    assert result["loss"].item() == 4.0
    assert (result["n"].item(), result["n"].dtype, result["tag"]) == (3, torch.int32, "x")
    assert fabric.all_reduce(torch.tensor([2.0, 6.0])).item() == 4.0


def test_all_reduce_mean_is_differentiable() -> None:
    x = torch.tensor([1.0, 3.0], requires_grad=True)
    strategy().all_reduce(x).backward()
    assert x.grad is not None and x.grad.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("reduce_op", ["foo", "", 3, dist.ReduceOp.BAND, dist.ReduceOp.BXOR])
def test_all_reduce_unknown_reduce_op(reduce_op: Any) -> None:
    with pytest.raises(InvalidReduceOpError) as excinfo:
        strategy().all_reduce(torch.tensor([1.0]), reduce_op=reduce_op)
    assert isinstance(excinfo.value, ValueError)
    message = str(excinfo.value)
    assert repr(reduce_op) in message or str(reduce_op) in message
    assert "sum" in message and "mean" in message


_OPS = {
    "mean": lambda t: t.double().mean(),
    "sum": lambda t: t.double().sum(),
    "max": lambda t: t.double().max(),
    "min": lambda t: t.double().min(),
}


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=24),
    rows=st.sampled_from([1, 2, 3]),
    reduce_op=st.sampled_from(sorted(_OPS)),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_all_reduce_matches_a_reduction_over_every_element(
    values: list[float], rows: int, reduce_op: str, dtype: torch.dtype
) -> None:
    usable = len(values) - len(values) % rows or len(values)
    t = torch.tensor(values[:usable], dtype=dtype)
    if usable % rows == 0:
        t = t.reshape(rows, -1)
    result = strategy().all_reduce({"v": [t]}, reduce_op=reduce_op)["v"][0]
    assert result.dtype == dtype and result.shape == ()
    assert result.double().item() == pytest.approx(_OPS[reduce_op](t).item(), rel=1e-5, abs=1e-4)


# ------------------------------------------------------------------------------------ the other methods


def test_one_process_collectives() -> None:
    s = strategy()
    t = torch.arange(3)
    assert s.all_gather(t) is t  # world size 1: nothing added
    data = {"a": [t]}
    assert s.all_gather(data, sync_grads=True) is data
    obj = {"k": [1, 2]}
    assert s.broadcast(obj) is obj and s.broadcast(obj, src=0) is obj
    assert s.barrier() is None and s.barrier("named") is None
    assert s.reduce_boolean_decision(True) is True and s.reduce_boolean_decision(0, all=False) is False


@pytest.mark.parametrize("src", [1, -1, "0", 0.0])
def test_broadcast_from_another_rank(src: Any) -> None:
    with pytest.raises(ValueError, match=r"broadcast\(src=.*\) is not a rank: DataParallelStrategy runs one"):
        strategy().broadcast(1, src=src)


def test_devices_and_sampler() -> None:
    s = DataParallelStrategy(parallel_devices=[torch.device("cuda", 1), torch.device("cuda", 0)])
    assert s.root_device == torch.device("cuda", 1)  # the first listed device gathers the outputs
    assert s.distributed_sampler_kwargs is None
    assert s.is_parallel is False and s.launcher is None
    assert repr(s) == "DataParallelStrategy(parallel_devices=['cuda:1', 'cuda:0'])"
    with pytest.raises(RuntimeError, match="has no devices yet"):
        _ = DataParallelStrategy().root_device


def test_batch_to_device() -> None:
    s = strategy()
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), 3]}
    assert s.batch_to_device(batch) is batch  # DataParallel scatters the inputs itself
    moved = s.batch_to_device(batch, torch.device("meta"))
    assert moved["x"].device.type == "meta" and moved["y"][0].device.type == "meta" and moved["y"][1] == 3


def test_setup_module_wraps_in_data_parallel_and_state_dict_has_no_prefix() -> None:
    s = strategy()
    module = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    s.module_to_device(module)
    wrapped = s.setup_module(module)
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is module
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    state = s.get_module_state_dict(wrapped)
    assert sorted(state) == sorted(module.state_dict())
    fresh = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    s.load_module_state_dict(s.setup_module(fresh), state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), module.state_dict().values()))
    s.load_module_state_dict(fresh, state)  # an unwrapped module works too
    with pytest.raises(RuntimeError, match="Missing key"):
        s.load_module_state_dict(wrapped, {}, strict=True)
    s.load_module_state_dict(wrapped, {}, strict=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="integer indices name real GPUs on a CUDA machine")
def test_cuda_indices_as_parallel_devices_on_a_machine_without_cuda() -> None:
    # DataParallel's device_ids may be integers (CUDA indices); without CUDA it calls the module directly
    s = DataParallelStrategy()
    s.parallel_devices = [0, 2, 1]  # type: ignore[list-item]
    assert s.root_device == 0
    module = nn.Linear(2, 2)
    wrapped = s.setup_module(module)
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is module
    x = torch.randn(3, 2)
    assert torch.equal(wrapped(x), module(x))
    assert sorted(s.get_module_state_dict(wrapped)) == ["bias", "weight"]


def test_training_with_an_instance_on_the_cpu_equals_single_device() -> None:
    def train(strategy: Any) -> tuple[list[float], torch.Tensor, Any]:
        torch.manual_seed(0)
        fabric = Fabric(accelerator="cpu", strategy=strategy)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = fabric.setup(model, optimizer)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
        losses = []
        for i in (0, 8, 0, 8, 0, 8):
            loss = nn.functional.mse_loss(model(x[i : i + 8]), y[i : i + 8])
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            losses.append(loss.item())
        with fabric.no_backward_sync(model):  # nothing to synchronise: a no-op
            pass
        return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]), model

    losses, params, model = train(DataParallelStrategy())
    ref_losses, ref_params, _ = train("single_device")
    assert type(model._forward_module).__name__ == "DataParallel"
    assert losses == ref_losses and torch.equal(params, ref_params)
    assert losses[4] < losses[2] < losses[0]  # the same batch, seen again after each two steps
    assert sorted(model.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]


# ------------------------------------------------------------------------------------ plan


def plan(**kwargs: Any) -> Any:
    kwargs.setdefault("env", {})
    kwargs.setdefault("machine", Machine())
    return resolve_plan(**kwargs)


def test_registry_entry() -> None:
    entry = STRATEGY_REGISTRY["dp"]
    assert (entry.class_name, entry.parallel, entry.start_method, entry.multi_device) == (
        "DataParallelStrategy",
        False,
        None,
        True,
    )


@pytest.mark.parametrize(("devices", "expected"), [(1, (0,)), (2, (0, 1)), ([3, 1], (3, 1)), (-1, (0, 1, 2, 3))])
def test_plan_on_gpus_is_one_process_on_every_device(devices: Any, expected: tuple[int, ...]) -> None:
    result = plan(strategy="dp", accelerator="cuda", devices=devices, machine=Machine(cuda_devices=4))
    assert (result.strategy, result.parallel, result.start_method) == ("dp", False, None)
    assert (result.devices, result.world_size, result.num_processes, result.warnings) == (expected, 1, 1, ())


@pytest.mark.parametrize(
    ("kwargs", "processes"),
    [
        pytest.param({"accelerator": "cpu"}, 1, id="cpu"),
        pytest.param({}, 1, id="auto-accelerator-without-cuda"),
        pytest.param({"accelerator": "cpu", "devices": 2}, 2, id="cpu-two-devices"),
    ],
)
def test_plan_on_the_cpu_falls_back_to_ddp_with_a_warning(kwargs: dict[str, Any], processes: int) -> None:
    result = plan(strategy="dp", **kwargs)
    assert (result.strategy, result.parallel, result.start_method, result.world_size) == (
        "ddp",
        True,
        "popen",
        processes,
    )
    (warning,) = result.warnings
    assert "'dp' is not supported on CPUs, hence setting `strategy='ddp'`" in warning  # Lightning's words


def test_plan_fallback_in_a_notebook_follows_ddp() -> None:
    with pytest.raises(RuntimeError, match=r"`Fabric\(strategy='ddp'\)` is not compatible with an interactive"):
        plan(strategy="dp", accelerator="cpu", devices=2, machine=Machine(interactive=True))


def test_plan_refuses_several_nodes() -> None:
    env = {"MASTER_ADDR": "a", "MASTER_PORT": "1"}
    with pytest.raises(ValueError, match=r"strategy='dp' runs one process on one machine, but num_nodes=2"):
        plan(strategy="dp", accelerator="cuda", num_nodes=2, env=env, machine=Machine(cuda_devices=2))


def test_plan_refuses_mps() -> None:
    with pytest.raises(ValueError, match=r"strategy='dp' replicates the module on CUDA devices.*accelerator='mps'"):
        plan(strategy="dp", machine=Machine(mps_available=True))


def test_plan_with_an_instance() -> None:
    on_gpus = plan(strategy=DataParallelStrategy(), accelerator="cuda", devices=2, machine=Machine(cuda_devices=2))
    assert (on_gpus.strategy, on_gpus.parallel, on_gpus.devices, on_gpus.world_size) == ("instance", False, (0, 1), 1)
    assert plan(strategy=DataParallelStrategy(), accelerator="cpu").devices == (0,)
    # an instance is used as given (Lightning falls back only for the name), but two CPU "devices" mean nothing
    with pytest.raises(ValueError, match=r"strategy='DataParallelStrategy' runs one process on one device"):
        plan(strategy=DataParallelStrategy(), accelerator="cpu", devices=2)


def test_fabric_fills_in_the_devices_of_an_instance() -> None:
    fabric = Fabric(accelerator="cpu", strategy=DataParallelStrategy())
    assert fabric.strategy.parallel_devices == [CPU] and fabric.device == CPU and fabric.world_size == 1
    given = DataParallelStrategy(parallel_devices=[CPU])
    assert Fabric(accelerator="cpu", strategy=given).strategy.parallel_devices == [CPU]


def test_fabric_dp_on_the_cpu_warns_and_runs_ddp() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fabric = Fabric(accelerator="cpu", strategy="dp")
    assert isinstance(fabric.strategy, DDPStrategy)
    assert any("hence setting `strategy='ddp'`" in str(w.message) for w in caught)


@pytest.mark.compat
@pytest.mark.skipif(
    lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)"
)
@pytest.mark.timeout(120)
def test_dp_without_cuda_matches_lightning_fabric() -> None:
    results = {}
    for library, python in (("lightning", lightning_python()), ("fabric_lite", None)):
        done = run_python(["tests/helpers/scripts/dp_compat.py", library], timeout=90, python=python)
        assert done.returncode == 0, done.output
        (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        results[library] = json.loads(line[len("RESULT ") :])
    ours, theirs = results["fabric_lite"], results["lightning"]
    for case in ("cpu", "auto", "cpu_two"):
        assert (ours[case]["strategy"], ours[case]["world_size"]) == (
            theirs[case]["strategy"],
            theirs[case]["world_size"],
        )
        (their_warning,) = theirs[case]["dp_warnings"]
        (our_warning,) = ours[case]["dp_warnings"]
        assert their_warning.rstrip(".") in our_warning
    assert ours["instance"] == theirs["instance"]


# ------------------------------------------------------------------------------------ CUDA


def _cuda_check(name: str) -> dict:
    done = run_python(["tests/helpers/scripts/cuda_dp_checks.py", name], timeout=180)
    assert done.returncode == 0, done.output
    rows = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(rows) == 1, done.output
    return rows[0]  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_the_cuda_check_script_runs_on_the_cpu() -> None:
    """The CUDA checks' loop with an instance on the CPU, so that the script is exercised without a GPU."""
    done = run_python(["tests/helpers/scripts/cuda_dp_checks.py", "dp_one_device", "cpu"], timeout=60)
    assert done.returncode == 0, done.output
    (row,) = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert row["wrapper"] == "DataParallel" and row["same_as_single_device"] and row["loss_went_down"]
    assert (row["mean"], row["sum"], row["restored_equal"]) == (2.0, 4.0, True)
    assert row["checkpoint_keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.timeout(240)
def test_dp_training_loop_on_one_gpu() -> None:
    r = _cuda_check("dp_one_device")
    assert (r["strategy"], r["wrapper"], r["device"]) == ("DataParallelStrategy", "DataParallel", "cuda:0")
    assert r["param_devices"] == ["cuda:0"] and r["batch_devices"] == ["cuda:0"] and r["output_devices"] == ["cuda:0"]
    assert r["loss_went_down"] and r["same_as_single_device"]  # one device: DataParallel calls the module directly
    assert (r["mean"], r["sum"]) == (2.0, 4.0)
    assert r["checkpoint_keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"] and r["restored_equal"]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.timeout(240)
def test_dp_on_every_gpu() -> None:
    r = _cuda_check("dp_every_device")
    assert r["devices"] == [f"cuda:{i}" for i in range(r["count"])]
    assert r["replica_devices"] == r["devices"]  # one replica per GPU
    assert r["output_devices"] == ["cuda:0"]  # gathered on the first device
    assert r["loss_went_down"]
    # the same data and steps; splitting the batch only reorders float sums
    assert r["max_diff_to_single_device"] < 1e-4


@pytest.mark.cuda
@needs_cuda
@pytest.mark.timeout(240)
def test_dp_with_cpu_devices_on_a_cuda_machine_is_refused() -> None:
    r = _cuda_check("cpu_devices")
    assert r["raised"] == "ValueError" and "parallel_devices holds ['cpu']" in r["message"]
