"""``Fabric`` and its wrappers as Lightning Fabric's own tests see them, in one process: the set-up module's
``device``/``dtype``, ``mark_forward_method``'s inputs, the step methods' redirection, ``_unwrap_objects``,
``launch``'s checks, and how ``save``/``load``/``load_raw`` call the strategy."""

from __future__ import annotations

import copy
import pickle
from contextlib import nullcontext
from typing import Any, ClassVar
from unittest.mock import Mock

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from fabric_lite import Fabric
from fabric_lite.strategies.single_device import SingleDeviceStrategy
from fabric_lite.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin
from fabric_lite.wrappers import _FabricDataLoader, _FabricModule, _FabricOptimizer, _unwrap_compiled, _unwrap_objects


def _fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


@pytest.mark.parametrize("method", ["setup", "setup_module"])
@pytest.mark.parametrize("move_to_device", [True, False])
def test_the_set_up_module_knows_its_device(method: str, move_to_device: bool) -> None:
    fabric = _fabric()
    model = getattr(fabric, method)(nn.Linear(2, 3), move_to_device=move_to_device)
    assert isinstance(model, _DeviceDtypeModuleMixin)
    assert model.device == torch.device("cpu") and model.dtype is torch.float32
    empty = getattr(fabric, method)(nn.Sequential(), move_to_device=move_to_device)  # no parameter to ask
    assert empty.device == torch.device("cpu")


def test_the_set_up_module_passes_moves_and_casts_to_modules_of_its_kind_inside() -> None:
    class Inner(_DeviceDtypeModuleMixin):
        pass

    inner = Inner()
    model = _fabric().setup(nn.Sequential(inner))
    model.to(torch.float64)
    assert model.dtype is inner.dtype is torch.float64
    model.half()
    assert inner.dtype is torch.float16


def test_the_precision_of_fabric_is_the_strategys() -> None:
    fabric = Fabric(accelerator="cpu", devices=1, precision="64-true")
    assert fabric._precision is fabric.strategy.precision


class _Wrapper(nn.Module):
    """What a strategy such as DDP puts around the module: its forward calls the module's."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.module(*args, **kwargs)


class _Steps(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        return self(x) * 2

    def helper(self) -> int:
        return 3


def test_mark_forward_method_takes_a_name_or_a_bound_method_only() -> None:
    module = _Steps()
    wrapped = _FabricModule(_Wrapper(module), SingleDeviceStrategy(device=torch.device("cpu")), original_module=module)
    with pytest.raises(TypeError, match="Expected a method or a string, but got: function"):
        wrapped.mark_forward_method(lambda: None)
    with pytest.raises(ValueError, match="You cannot mark the forward method itself"):
        wrapped.mark_forward_method("forward")
    with pytest.raises(AttributeError, match=r"`_Steps.missing` does not exist or is not a method"):
        wrapped.mark_forward_method("missing")
    wrapped.mark_forward_method(module.helper)
    assert "helper" in wrapped._forward_methods


def test_a_step_method_is_looked_up_when_it_is_called() -> None:
    module = _Steps()
    forward_module = _Wrapper(module)
    wrapped = _FabricModule(forward_module, SingleDeviceStrategy(device=torch.device("cpu")), original_module=module)
    redirect = wrapped.predict_step  # a LightningModule step method _Steps lacks: no error until it is called
    assert redirect.__name__ == "call_forward_module"
    with pytest.raises(AttributeError, match="has no attribute 'predict_step'"):
        redirect(torch.zeros(1))
    assert "forward" not in module.__dict__  # the temporary redirection is undone after the error too
    assert torch.equal(wrapped.training_step(torch.zeros(1)), torch.full((1,), 2.0))
    assert forward_module.calls == 2  # both went through the strategy's module


def test_unwrap_objects_unwraps_nested_collections_and_loaders() -> None:
    fabric = _fabric()
    net = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model, wrapped_optimizer = fabric.setup(net, optimizer)
    loader = DataLoader(range(4))
    wrapped_loader = fabric.setup_dataloaders(loader)
    assert isinstance(wrapped_optimizer, _FabricOptimizer) and isinstance(wrapped_loader, _FabricDataLoader)
    state = {"n": 1, "model": model, "nested": [model, wrapped_optimizer, (wrapped_loader,)], "loader": loader}
    assert _unwrap_objects(state) == {"n": 1, "model": net, "nested": [net, optimizer, (loader,)], "loader": loader}
    assert _unwrap_objects(torch.compile(model)) is net


def test_save_keeps_the_loader_wrapper_so_the_checkpoint_holds_its_position() -> None:
    fabric = _fabric()
    loader = fabric.setup_dataloaders(DataLoader(range(4)))
    fabric.strategy.save_checkpoint = Mock()  # type: ignore[method-assign]
    fabric.save("ckpt", {"loader": loader})
    assert fabric.strategy.save_checkpoint.call_args.kwargs["state"]["loader"] is loader


def test_unwrap_compiled_returns_the_module_and_its_settings() -> None:
    net = nn.Linear(1, 1)
    module, settings = _unwrap_compiled(torch.compile(net, backend="eager"))
    assert module is net and settings is not None
    assert _unwrap_compiled(net) == (net, None)


def test_save_load_and_load_raw_call_the_strategy_by_keyword() -> None:
    fabric = _fabric()
    net = nn.Linear(2, 2)
    model = fabric.setup(net)
    strategy = fabric.strategy
    strategy.save_checkpoint = Mock()  # type: ignore[method-assign]
    strategy.load_checkpoint = Mock(return_value={})  # type: ignore[method-assign]
    fabric.save("a.ckpt", {"model": model})
    strategy.save_checkpoint.assert_called_once_with(path="a.ckpt", state={"model": net}, filter=None)
    fabric.load("a.ckpt", weights_only=False)
    strategy.load_checkpoint.assert_called_with(path="a.ckpt", state=None, strict=True, weights_only=False)
    fabric.load_raw("b.pt", model, strict=False)
    strategy.load_checkpoint.assert_called_with(path="b.pt", state=net, strict=False, weights_only=None)


def test_launch_refuses_what_a_called_function_returned() -> None:
    def train(fabric: Fabric) -> None:
        return None

    with pytest.raises(TypeError, match=r"needs to be a callable, but got None.*\.launch\(your_fn\)"):
        _fabric().launch(train(None))  # type: ignore[arg-type]  # the mistake: train() instead of train
    with pytest.raises(TypeError, match="needs to take at least one argument"):
        _fabric().launch(lambda: None)
    assert _fabric().launch() is None  # no function: nothing to run here


def test_launch_without_a_function_goes_to_a_launcher_that_needs_none() -> None:
    fabric = _fabric()
    fabric.strategy._launcher = Mock()  # a launcher that does not say it needs a function
    fabric.launch()
    fabric.strategy._launcher.launch.assert_called_once()


def test_a_parallel_strategy_needs_launch_first() -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    with pytest.raises(RuntimeError, match=r"you must call `\.launch\(\)`"):
        fabric.setup(nn.Linear(1, 1))


def test_log_dict_refuses_a_tensor_of_several_elements() -> None:
    fabric = Fabric(accelerator="cpu", devices=1, loggers=Mock())
    with pytest.raises(ValueError, match="it cannot be converted to a scalar"):
        fabric.log("x", torch.tensor([3, 4]))


def test_a_loader_made_in_the_launched_function_can_be_made_again_around_a_sampler() -> None:
    from torch.utils.data import DistributedSampler

    from fabric_lite.utilities.data import replace_sampler
    from fabric_lite.utilities.exceptions import MisconfigurationException

    class Custom(DataLoader):  # type: ignore[type-arg]
        def __init__(self, size: int, **kwargs: Any) -> None:  # `size` is kept under no attribute of that name
            super().__init__(range(size), **kwargs)

    loader = _fabric().launch(lambda fabric: Custom(6, batch_size=2))
    again = replace_sampler(loader, DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False))
    assert type(again) is Custom and [batch.tolist() for batch in again] == [[1, 3], [5]]
    with pytest.raises(MisconfigurationException, match=r"The missing attributes are \['size'\]"):
        replace_sampler(Custom(6, batch_size=2), DistributedSampler(range(6), num_replicas=2, rank=1))  # made outside


def test_a_filter_that_keeps_nothing_of_an_entry_leaves_the_entry_out(tmp_path: Any) -> None:
    """As in Lightning: ``save(filter=...)`` writes an entry only where its filter keeps something."""
    fabric = Fabric(accelerator="cpu", devices=1)
    model = nn.Linear(2, 2)
    state = {"model": model, "extra": {"a": 1, "b": "x"}, "step": 3}
    fabric.save(tmp_path / "ckpt.pt", state, filter={"model": lambda k, v: False, "extra": lambda k, v: k == "a"})
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True) == {"extra": {"a": 1}, "step": 3}


def test_any_object_that_saves_loads_and_removes_is_a_checkpoint_io() -> None:
    """Lightning takes any object as the checkpoint IO; fabric_lite takes any that has the three methods, and names
    the mistake otherwise (a class instead of an instance, a path)."""
    strategy = SingleDeviceStrategy("cpu")
    io = Mock()  # has every method
    strategy.checkpoint_io = io
    assert strategy.checkpoint_io is io
    for wrong in ("checkpoints/", object(), SingleDeviceStrategy):
        with pytest.raises(TypeError, match=r"expected an instance of fabric_lite\.plugins\.io\.CheckpointIO"):
            strategy.checkpoint_io = wrong  # type: ignore[assignment]


class _Finalised(torch.optim.SGD):
    """An optimizer whose class frees something when an instance goes (as DeepSpeedCPUAdam frees its C++ state)."""

    freed: ClassVar[list[int]] = []

    def __del__(self) -> None:
        _Finalised.freed.append(id(self))

    def scaled_lr(self, factor: float) -> float:
        return float(self.param_groups[0]["lr"]) * factor


def test_the_optimizer_wrapper_is_an_instance_of_the_optimizers_class() -> None:
    model, optimizer = _fabric().setup(*_linear_and(torch.optim.Adam))
    assert isinstance(optimizer, torch.optim.Adam) and isinstance(optimizer, _FabricOptimizer)
    assert type(optimizer).__name__ == "FabricAdam" and not isinstance(optimizer, torch.optim.SGD)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    optimizer.step()  # through the strategy, not Adam.step on the wrapper
    assert not torch.equal(before, model.weight) and optimizer.optimizer.state  # the wrapped optimizer's state
    # a stand-in reports the class it stands for; anything else that is not an optimizer gives the plain wrapper
    assert isinstance(_FabricOptimizer(Mock(spec=torch.optim.SGD), Mock()), torch.optim.SGD)
    assert type(_FabricOptimizer(Mock(), Mock())) is _FabricOptimizer


def test_the_optimizer_wrapper_runs_methods_of_the_optimizers_class_on_the_wrapped_state() -> None:
    _, optimizer = _fabric().setup(*_linear_and(_Finalised))
    assert optimizer.scaled_lr(2.0) == pytest.approx(0.2)
    optimizer.param_groups[0]["lr"] = 0.5  # the wrapped optimizer's groups
    assert optimizer.optimizer.param_groups[0]["lr"] == 0.5 and optimizer.scaled_lr(1.0) == 0.5


def test_a_wrapper_going_away_does_not_run_the_optimizers_finaliser() -> None:
    inner = _Finalised(nn.Linear(2, 1).parameters(), lr=0.1)
    wrapper = _FabricOptimizer(inner, _fabric().strategy)
    _Finalised.freed.clear()
    del wrapper
    assert _Finalised.freed == []  # the optimizer lives on: nothing of it may be freed
    del inner
    assert len(_Finalised.freed) == 1


def test_the_optimizer_wrapper_pickles_and_copies_as_a_wrapper_of_the_copy() -> None:
    strategy = _fabric().strategy
    inner = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
    wrapper = _FabricOptimizer(inner, strategy)
    for copied in (copy.deepcopy(wrapper), pickle.loads(pickle.dumps(wrapper))):
        assert type(copied).__name__ == "FabricSGD" and isinstance(copied, torch.optim.SGD)
        assert copied.optimizer is not inner and copied.param_groups[0]["momentum"] == 0.9


def test_setup_optimizers_is_refused_before_asking_a_strategy_that_sets_up_jointly() -> None:
    from fabric_lite.strategies.deepspeed import DeepSpeedStrategy

    fabric = _fabric()
    fabric._strategy = Mock(spec=DeepSpeedStrategy)  # a stand-in: the class alone decides
    fabric._launched = True
    with pytest.raises(RuntimeError, match=r"The `DeepSpeedStrategy` requires the model and optimizer\(s\) to be set"):
        fabric.setup_optimizers(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))
    fabric._strategy.setup_optimizer.assert_not_called()


class _OneTensorAtATime(SingleDeviceStrategy):
    """A strategy of one's own, written for Lightning's contract: its collectives take one tensor."""

    def all_reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        assert isinstance(tensor, torch.Tensor), tensor
        return tensor * 2

    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        assert isinstance(tensor, torch.Tensor), tensor
        return torch.stack([tensor, tensor])


def test_a_strategy_that_overrides_the_collectives_gets_one_tensor_per_call() -> None:
    fabric = Fabric(strategy=_OneTensorAtATime(torch.device("cpu")))
    data = {"a": torch.tensor(1.0), "b": [torch.tensor(2.0), "text"]}
    assert fabric.all_reduce(data) == {"a": torch.tensor(2.0), "b": [torch.tensor(4.0), "text"]}
    gathered = fabric.all_gather(data)
    assert gathered["a"].tolist() == [1.0, 1.0] and gathered["b"][0].tolist() == [2.0, 2.0]
    assert gathered["b"][1] == "text"


def test_fabric_lites_strategies_get_a_collections_tensors_in_one_call() -> None:
    fabric = _fabric()
    calls = []
    strategy = fabric.strategy
    original = type(strategy).all_reduce

    def recording(self: Any, tensors: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        calls.append(tensors)
        return original(self, tensors, group, reduce_op)

    recording.__dict__.update(original.__dict__)  # fabric_lite's mark: it takes a collection
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(strategy), "all_reduce", recording)
        fabric.all_reduce({"a": torch.tensor(1.0), "b": [torch.tensor(2), 3.0]})
    assert len(calls) == 1 and len(calls[0]) == 3


def test_backward_on_one_device_needs_no_set_up_model() -> None:
    weight = torch.ones(2, requires_grad=True)
    _fabric().backward((weight * 3).sum())
    assert weight.grad is not None and weight.grad.tolist() == [3.0, 3.0]


def _linear_and(optimizer_class: type[torch.optim.Optimizer]) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(2, 1)
    return model, optimizer_class(model.parameters(), lr=0.1)


# ---------------------------------------------------------------- a strategy written against Lightning's interface
class _LightningStyleStrategy(SingleDeviceStrategy):
    """Overrides ``setup_module_and_optimizers`` with Lightning's contract: (module, optimizers, scheduler)."""

    calls: ClassVar[list[Any]] = []

    def setup_module_and_optimizers(self, module: nn.Module, optimizers: list[Any], scheduler: Any = None) -> Any:
        type(self).calls.append(scheduler)
        return module, optimizers, scheduler


def test_setup_goes_through_lightnings_three_tuple_and_returns_the_scheduler() -> None:
    fabric = Fabric(accelerator="cpu", strategy=_LightningStyleStrategy(torch.device("cpu")))
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    set_up, fabric_optimizer, returned = fabric.setup(model, optimizer, scheduler=scheduler)
    assert _LightningStyleStrategy.calls == [scheduler] and returned is scheduler
    assert isinstance(set_up, _FabricModule) and fabric_optimizer.optimizer is optimizer
    plain = SingleDeviceStrategy(torch.device("cpu"))
    module, [same], none = plain.setup_module_and_optimizers(model, [optimizer])
    assert (module, same, none) == (model, optimizer, None)


def test_no_backward_sync_goes_through_the_strategys_control_and_warns_without_one() -> None:
    from fabric_lite.strategies import ParallelStrategy
    from fabric_lite.utilities.warnings import PossibleUserWarning

    fabric = Fabric(accelerator="cpu", devices=1)
    model = fabric.setup(nn.Linear(2, 2))
    with fabric.no_backward_sync(model):  # one device: nothing to skip, nothing said
        pass
    fabric._strategy = Mock(spec=ParallelStrategy, _backward_sync_control=None)
    expected = "`ParallelStrategy` does not support skipping the gradient"
    with pytest.warns(PossibleUserWarning, match=expected), fabric.no_backward_sync(model):
        pass
    control = Mock()
    control.no_backward_sync.return_value = nullcontext()
    fabric._strategy = Mock(_backward_sync_control=control)
    with fabric.no_backward_sync(model, enabled=False):
        pass
    control.no_backward_sync.assert_called_once_with(model._strategy_module, False)


def test_a_precision_of_duck_type_has_its_forward_hooks_called() -> None:
    """Full precision's hooks are skipped on the hot path (they do nothing); an object that is not a Precision (a
    plugin of duck type, a mock wrapping one) is called as it is, whatever its class says."""
    from fabric_lite.plugins.precision import Precision

    strategy = Mock()
    strategy.precision = Mock(wraps=Precision())
    module = nn.Linear(2, 2)
    wrapped = _FabricModule(module, strategy)
    wrapped(torch.ones(1, 2))
    wrapped(torch.ones(1, 2))
    assert strategy.precision.forward_context.call_count == 2
    assert strategy.precision.convert_input.call_count == 2 and strategy.precision.convert_output.call_count == 2
    plain = Mock(precision=Precision())
    assert _FabricModule(module, plain)._precision is None  # the real full precision: skipped
