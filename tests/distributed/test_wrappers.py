"""The objects returned by ``Fabric.setup*`` on one device: module, optimizer and 64-bit precision wrappers.

Everything runs in this process (``Fabric(accelerator="cpu", devices=1)``). Numerical comparisons are bit-exact:
the wrappers must add nothing to the arithmetic of a plain PyTorch loop.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from fabric_lite import Fabric, is_wrapped
from fabric_lite.strategies.single_device import SingleDeviceStrategy
from tests.helpers.harness import spawn_job


def _fabric(**kwargs):
    return Fabric(accelerator="cpu", devices=1, **kwargs)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.l2 = nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor(2.0))
        self.custom = "hello"

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))) * self.scale


def _net(seed: int = 0) -> _Net:
    torch.manual_seed(seed)
    return _Net()


def _batches(n: int = 5, seed: int = 123):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)) for _ in range(n)]


def _assert_same_parameters(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


# ---------------------------------------------------------------------------------------------- module wrapper
def test_state_dict_keys_have_no_prefix_and_equal_the_originals():
    model = _net()
    expected = copy.deepcopy(model.state_dict())
    fmodel = _fabric().setup(model)
    state = fmodel.state_dict()
    assert list(state) == list(expected) == ["scale", "l1.weight", "l1.bias", "l2.weight", "l2.bias"]
    for key in expected:
        assert torch.equal(state[key], expected[key])
    assert not any(key.startswith(("_forward_module", "_original_module", "module.")) for key in state)


def test_load_state_dict_loads_into_the_original_module():
    model = _net(0)
    fmodel = _fabric().setup(model)
    source = _net(1)
    result = fmodel.load_state_dict(source.state_dict())
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    _assert_same_parameters(model, source)
    with pytest.raises(RuntimeError, match="Missing key"):
        fmodel.load_state_dict({"l1.weight": source.l1.weight})
    fmodel.load_state_dict({"l1.weight": torch.zeros(8, 4)}, strict=False)
    assert torch.equal(model.l1.weight, torch.zeros(8, 4))


def test_module_property_is_the_original_and_parameters_are_shared():
    model = _net()
    fmodel = _fabric().setup(model)
    assert fmodel.module is model
    assert isinstance(fmodel, nn.Module)
    # the wrapper's parameters are the original's, each once
    assert [id(p) for p in fmodel.parameters()] == [id(p) for p in model.parameters()]


def test_attribute_get_and_set_pass_through_to_the_original():
    model = _net()
    fmodel = _fabric().setup(model)
    assert fmodel.custom == "hello"
    assert fmodel.l1 is model.l1
    assert fmodel.scale is model.scale
    fmodel.custom = "changed"
    assert model.custom == "changed"
    fmodel.brand_new = 7
    assert model.brand_new == 7 and fmodel.brand_new == 7
    replacement = nn.Linear(8, 3)
    fmodel.l2 = replacement
    assert model.l2 is replacement and fmodel.l2 is replacement
    x = torch.randn(2, 4)
    assert torch.equal(fmodel(x), replacement(torch.relu(model.l1(x))) * 2.0)
    with pytest.raises(AttributeError, match="does_not_exist"):
        fmodel.does_not_exist  # noqa: B018


def test_train_and_eval_reach_the_original():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    fmodel = _fabric().setup(model)
    fmodel.eval()
    assert not fmodel.training and not model.training and not model[1].training
    x = torch.randn(4, 3)
    assert torch.equal(fmodel(x), fmodel(x))  # dropout off
    fmodel.train()
    assert fmodel.training and model.training and model[1].training
    fmodel.train(False)
    assert not model[1].training


def test_calling_the_wrapper_equals_calling_the_module():
    model = _net()
    fmodel = _fabric().setup(model)
    x = torch.randn(5, 4)
    assert torch.equal(fmodel(x), model(x))
    kw_model = nn.Bilinear(2, 3, 4)
    fkw = _fabric().setup(kw_model)
    a, b = torch.randn(2, 2), torch.randn(2, 3)
    assert torch.equal(fkw(input1=a, input2=b), kw_model(a, b))


def test_is_wrapped():
    fabric = _fabric()
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(4)), batch_size=2)
    assert not is_wrapped(model) and not is_wrapped(optimizer) and not is_wrapped(loader)
    for plain in (None, 3, "x", torch.zeros(1), [model], {"model": model}):
        assert not is_wrapped(plain)
    fmodel, foptimizer = fabric.setup(model, optimizer)
    floader = fabric.setup_dataloaders(loader)
    assert is_wrapped(fmodel) and is_wrapped(foptimizer) and is_wrapped(floader)


# ---------------------------------------------------------------------------------------------- setup return forms
def test_setup_return_forms():
    fabric = _fabric()
    model = _net()
    assert is_wrapped(fabric.setup(model))

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = fabric.setup(model, opt)
    assert isinstance(out, tuple) and len(out) == 2
    assert out[0].module is model and out[1].optimizer is opt

    model = _net()
    opt1 = torch.optim.SGD(model.l1.parameters(), lr=0.1)
    opt2 = torch.optim.Adam(model.l2.parameters(), lr=0.1)
    out = fabric.setup(model, opt1, opt2)
    assert len(out) == 3 and out[1].optimizer is opt1 and out[2].optimizer is opt2

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    out = fabric.setup(model, opt, scheduler=scheduler)
    assert len(out) == 3 and out[2] is scheduler  # the scheduler passes through unchanged


def test_scheduler_passed_through_setup_keeps_scheduling():
    fabric = _fabric()
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    fmodel, fopt, scheduler = fabric.setup(model, opt, scheduler=scheduler)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x, y in _batches(4):
            fopt.zero_grad()
            fabric.backward(nn.functional.mse_loss(fmodel(x), y))
            fopt.step()
            scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.25


def test_setup_module_then_setup_optimizers():
    fabric = _fabric()
    model = _net()
    fmodel = fabric.setup_module(model)
    optimizer = torch.optim.SGD(fmodel.parameters(), lr=0.1)
    foptimizer = fabric.setup_optimizers(optimizer)
    assert foptimizer.optimizer is optimizer
    o1 = torch.optim.SGD(model.l1.parameters(), lr=0.1)
    o2 = torch.optim.SGD(model.l2.parameters(), lr=0.1)
    both = fabric.setup_optimizers(o1, o2)
    assert isinstance(both, tuple) and [o.optimizer for o in both] == [o1, o2]


class _ToSpy(nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)
        self.to_calls: list[tuple] = []

    def to(self, *args, **kwargs):  # type: ignore[override]
        self.to_calls.append((args, kwargs))
        return super().to(*args, **kwargs)


def test_move_to_device_false_leaves_the_model_where_it_is():
    fabric = _fabric()
    with torch.device("meta"):
        model = nn.Linear(3, 3)  # a meta model cannot be moved to the CPU: .to("cpu") would raise
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fmodel, _ = fabric.setup(model, opt, move_to_device=False)
    assert all(p.device.type == "meta" for p in fmodel.parameters())

    spy = _ToSpy()
    fabric.setup(spy, move_to_device=False)
    assert spy.to_calls == []
    spy = _ToSpy()
    fabric.setup(spy)
    assert spy.to_calls, "move_to_device=True (the default) should move the module"

    spy = _ToSpy()
    fabric.setup_module(spy, move_to_device=False)
    assert spy.to_calls == []


# ---------------------------------------------------------------------------------------------- mark_forward_method
class _Counting(nn.Module):
    """What a strategy such as DDP does: wrap the module; only calls through its forward are "seen"."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.module(*args, **kwargs)


class _WrappingStrategy(SingleDeviceStrategy):
    def setup_module(self, module):
        return _Counting(module)


class _Generator(nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)
        self.seen_dtypes: list[torch.dtype] = []

    def plain(self, x):
        self.seen_dtypes.append(x.dtype)
        return x + 1

    def generate(self, x):
        # the common pattern: a method that itself calls the model's forward
        return self(x) * 2


def test_mark_forward_method_routes_through_the_strategy_forward():
    fabric = Fabric(accelerator="cpu", devices=1, strategy=_WrappingStrategy(device="cpu"))
    model = _Generator()
    fmodel = fabric.setup(model)
    wrapper = fmodel._forward_module
    x = torch.zeros(2)
    assert torch.equal(fmodel.plain(x), x + 1)
    assert wrapper.calls == 0  # not marked: bypasses the strategy's forward
    fmodel.mark_forward_method("plain")
    assert torch.equal(fmodel.plain(x), x + 1)
    assert wrapper.calls == 1
    assert "forward" not in model.__dict__  # the temporary redirection is undone
    assert torch.equal(fmodel(torch.ones(2)), model(torch.ones(2)))  # forward itself still works
    fmodel.mark_forward_method(model.plain)  # a bound method is accepted too


def test_mark_forward_method_converts_inputs_under_the_precision():
    fabric = Fabric(accelerator="cpu", devices=1, precision="64-true", strategy=_WrappingStrategy(device="cpu"))
    model = _Generator()
    fmodel = fabric.setup(model)
    fmodel.mark_forward_method("plain")
    out = fmodel.plain(torch.zeros(2, dtype=torch.float32))
    assert model.seen_dtypes == [torch.float64]
    assert out.dtype == torch.float32


@pytest.mark.timeout(20)
def test_marked_method_may_call_forward_itself():
    fabric = Fabric(accelerator="cpu", devices=1, strategy=_WrappingStrategy(device="cpu"))
    model = _Generator()
    fmodel = fabric.setup(model)
    fmodel.mark_forward_method("generate")
    x = torch.ones(2)
    result = fmodel.generate(x)
    assert torch.equal(result, model(x) * 2)
    assert fmodel._forward_module.calls == 1


def test_mark_forward_method_rejects_bad_input():
    fmodel = _fabric().setup(_Generator())
    with pytest.raises(ValueError, match="forward"):
        fmodel.mark_forward_method("forward")
    with pytest.raises(AttributeError, match="nope"):
        fmodel.mark_forward_method("nope")
    with pytest.raises(TypeError):
        fmodel.mark_forward_method(3)


class _StepModule(_Generator):
    """A LightningModule's shape without Lightning: step methods, and the ``_fabric`` attribute Lightning checks."""

    def __init__(self) -> None:
        super().__init__()
        self._fabric = None
        self._fabric_optimizers: list = []
        self.hooks: list[str] = []

    def training_step(self, x):
        return self(x) + 1

    def validation_step(self, x):
        return self(x) - 1

    def on_train_epoch_end(self):
        self.hooks.append("on_train_epoch_end")


def test_lightning_step_methods_run_through_the_strategy_forward_unmarked():
    fabric = Fabric(accelerator="cpu", devices=1, strategy=_WrappingStrategy(device="cpu"))
    model = _StepModule()
    fmodel = fabric.setup(model)
    x = torch.ones(2)
    assert torch.equal(fmodel.training_step(x), model(x) + 1)
    assert torch.equal(fmodel.validation_step(x), model(x) - 1)
    assert fmodel._forward_module.calls == 2  # as in Lightning: no mark_forward_method needed for these
    assert fmodel.plain(x) is not None and fmodel._forward_module.calls == 2  # other methods are not routed
    assert "forward" not in model.__dict__
    with pytest.raises(AttributeError, match="training_step"):
        fabric.setup(_Generator()).training_step(x)  # a module without the method says so


def test_setup_attaches_fabric_and_optimizers_to_a_module_with_a_fabric_attribute():
    fabric = _fabric()
    model = _StepModule()
    fmodel, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model._fabric is fabric and model._fabric_optimizers == [optimizer]
    assert model._fabric_optimizers[0] is optimizer and is_wrapped(optimizer)
    fabric.call("on_train_epoch_end")  # the module became a callback, once
    fabric.setup(model_2 := _StepModule())
    assert model_2._fabric is fabric and model_2._fabric_optimizers == []
    fabric.call("on_train_epoch_end")
    assert model.hooks == ["on_train_epoch_end"] * 2 and model_2.hooks == ["on_train_epoch_end"]
    model_3 = _StepModule()
    fmodule = fabric.setup_module(model_3)
    assert model_3._fabric is fabric and model_3._fabric_optimizers == []
    assert sum(callback is model_3 for callback in fabric._callbacks) == 1
    plain = _Generator()
    fabric.setup_module(plain)
    assert "_fabric" not in plain.__dict__  # an ordinary module is left alone
    assert fmodule.module is model_3


# ---------------------------------------------------------------------------------------------- optimizer wrapper
def _train(model, optimizer, batches, backward, closure: bool = False):
    for x, y in batches:
        if closure:

            def closure_fn():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                backward(loss)
                return loss

            optimizer.step(closure_fn)
        else:
            optimizer.zero_grad()
            backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
        lambda p: torch.optim.Adam(p, lr=1e-2),
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    ],
    ids=["sgd-momentum", "adam", "adamw"],
)
def test_optimizer_step_is_bit_exact_with_the_raw_optimizer(make_optimizer):
    raw_model = _net()
    model = copy.deepcopy(raw_model)
    raw_opt = make_optimizer(raw_model.parameters())
    fabric = _fabric()
    fmodel, fopt = fabric.setup(model, make_optimizer(model.parameters()))
    assert isinstance(fopt, torch.optim.Optimizer)
    batches = _batches(6)
    _train(raw_model, raw_opt, batches, lambda loss: loss.backward())
    _train(fmodel, fopt, batches, fabric.backward)
    _assert_same_parameters(model, raw_model)
    raw_state, state = raw_opt.state_dict(), fopt.state_dict()
    assert raw_state["param_groups"] == state["param_groups"]
    for index, entry in raw_state["state"].items():
        for name, value in entry.items():
            assert torch.equal(torch.as_tensor(state["state"][index][name]), torch.as_tensor(value)), (index, name)


def test_closure_is_passed_to_the_optimizer():
    raw_model = _net()
    model = copy.deepcopy(raw_model)
    raw_opt = torch.optim.LBFGS(raw_model.parameters(), lr=0.5, max_iter=4)
    fabric = _fabric()
    fmodel, fopt = fabric.setup(model, torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4))
    batches = _batches(3)
    _train(raw_model, raw_opt, batches, lambda loss: loss.backward(), closure=True)
    _train(fmodel, fopt, batches, fabric.backward, closure=True)
    _assert_same_parameters(model, raw_model)

    # the closure is called by the optimizer, once for SGD, and its loss is returned
    sgd_model = _net()
    fsgd_model, fsgd = fabric.setup(sgd_model, torch.optim.SGD(sgd_model.parameters(), lr=0.1))
    x, y = batches[0]
    calls = []

    def closure():
        calls.append(1)
        fsgd.zero_grad()
        loss = nn.functional.mse_loss(fsgd_model(x), y)
        fabric.backward(loss)
        return loss

    returned = fsgd.step(closure)
    assert calls == [1]
    assert isinstance(returned, torch.Tensor) and returned.ndim == 0


def test_zero_grad():
    fabric = _fabric()
    model = _net()
    fmodel, fopt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fabric.backward(fmodel(torch.randn(2, 4)).sum())
    assert all(p.grad is not None for p in model.parameters())
    fopt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    fabric.backward(fmodel(torch.randn(2, 4)).sum())
    fopt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_optimizer_state_dict_round_trip():
    fabric = _fabric()
    model = _net()
    fmodel, fopt = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=1e-2))
    _train(fmodel, fopt, _batches(2), fabric.backward)
    saved = copy.deepcopy(fopt.state_dict())
    assert saved["param_groups"] == fopt.optimizer.state_dict()["param_groups"]

    other_model = copy.deepcopy(model)
    fother, fother_opt = fabric.setup(other_model, torch.optim.Adam(other_model.parameters(), lr=0.5))
    fother_opt.load_state_dict(saved)
    assert fother_opt.optimizer.param_groups[0]["lr"] == 1e-2
    loaded = fother_opt.optimizer.state_dict()
    for index, entry in saved["state"].items():
        for name, value in entry.items():
            assert torch.equal(torch.as_tensor(loaded["state"][index][name]), torch.as_tensor(value))
    # after loading, both continue identically
    batches = _batches(2, seed=5)
    _train(fmodel, fopt, batches, fabric.backward)
    _train(fother, fother_opt, batches, fabric.backward)
    _assert_same_parameters(model, other_model)


def test_param_group_edits_reach_the_real_optimizer():
    fabric = _fabric()
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _, fopt = fabric.setup(model, optimizer)
    assert fopt.param_groups is optimizer.param_groups
    assert fopt.state is optimizer.state
    assert fopt.defaults is optimizer.defaults
    for group in fopt.param_groups:
        group["lr"] = 0.5
    assert optimizer.param_groups[0]["lr"] == 0.5
    extra = nn.Parameter(torch.zeros(2))
    fopt.add_param_group({"params": [extra], "lr": 0.01})
    assert optimizer.param_groups[-1]["params"][0] is extra
    # a step with the new lr: p <- p - 0.5 * grad
    before = model.l1.bias.detach().clone()
    fopt.zero_grad()
    fabric.backward(model.l1.bias.sum())
    fopt.step()
    assert torch.equal(model.l1.bias.detach(), before - 0.5 * torch.ones_like(before))


@pytest.mark.parametrize("kind", ["step", "lambda"])
def test_lr_schedulers_created_after_setup(kind):
    fabric = _fabric()
    raw_model = _net()
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1.0)
    model = copy.deepcopy(raw_model)
    fmodel, fopt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))

    def make(opt):
        if kind == "step":
            return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda epoch: 1.0 / (epoch + 1))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler = make(fopt)
        raw_scheduler = make(raw_opt)
        lrs, raw_lrs = [], []
        for x, y in _batches(5):
            fopt.zero_grad()
            fabric.backward(nn.functional.mse_loss(fmodel(x), y))
            fopt.step()
            scheduler.step()
            lrs.append(fopt.param_groups[0]["lr"])
            raw_opt.zero_grad()
            nn.functional.mse_loss(raw_model(x), y).backward()
            raw_opt.step()
            raw_scheduler.step()
            raw_lrs.append(raw_opt.param_groups[0]["lr"])
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "overridden" in m or "lr_scheduler.step()" in m], messages
    expected = [1.0, 0.5, 0.5, 0.25, 0.25] if kind == "step" else [1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6]
    assert lrs == raw_lrs == expected
    assert fopt.optimizer.param_groups[0]["lr"] == expected[-1]
    assert scheduler.get_last_lr() == [expected[-1]]
    _assert_same_parameters(model, raw_model)
    assert scheduler.state_dict()["last_epoch"] == 5


def test_two_schedulers_on_one_wrapped_optimizer_do_not_recurse():
    fabric = _fabric()
    model = _net()
    _, fopt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
    first = torch.optim.lr_scheduler.StepLR(fopt, step_size=1, gamma=0.5)
    second = torch.optim.lr_scheduler.ExponentialLR(fopt, gamma=0.5)
    fopt.zero_grad()
    fabric.backward(model(torch.randn(2, 4)).sum())
    fopt.step()
    first.step()
    second.step()
    assert fopt.param_groups[0]["lr"] == 0.25


def test_optimizer_step_callback_hook():
    calls = []

    class Callback:
        def on_after_optimizer_step(self, strategy, optimizer):
            calls.append(optimizer)

    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[Callback()])
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _, fopt = fabric.setup(model, optimizer)
    fabric.backward(model(torch.randn(2, 4)).sum())
    fopt.step()
    assert calls == [optimizer]


# ---------------------------------------------------------------------------------------------- 64-true precision
class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.seen: list[tuple] = []

    def forward(self, x, index=None):
        self.seen.append((x.dtype, None if index is None else index.dtype, torch.get_default_dtype()))
        return self.linear(x), index, torch.zeros(1)


def test_double_precision_converts_module_inputs_and_outputs():
    fabric = _fabric(precision="64-true")
    model = _Recorder()
    fmodel = fabric.setup(model)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x = torch.randn(4, 3)
    out, index, created = fmodel(x, index=torch.arange(4))
    # inside forward: float inputs are float64, integer inputs unchanged, new tensors default to float64
    assert model.seen == [(torch.float64, torch.int64, torch.float64)]
    assert out.dtype == torch.float32 and created.dtype == torch.float32 and index.dtype == torch.int64
    expected = (x.double() @ model.linear.weight.T + model.linear.bias).float()
    assert torch.equal(out, expected)
    assert torch.get_default_dtype() == torch.float32
    # gradients flow through the casts, in float64
    fabric.backward(out.sum())
    assert model.linear.weight.grad.dtype == torch.float64


def test_double_precision_training_equals_a_hand_written_float64_loop():
    raw = _net()
    model = copy.deepcopy(raw)
    raw_opt = torch.optim.SGD(raw.parameters(), lr=0.1, momentum=0.9)
    raw.double()
    fabric = _fabric(precision="64-true")
    fmodel, fopt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    # the optimizer still updates the module's (now float64) parameters
    assert [id(p) for p in fopt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    for x, y in _batches(4):
        fopt.zero_grad()
        fabric.backward(nn.functional.mse_loss(fmodel(x), y))
        fopt.step()
        raw_opt.zero_grad()
        nn.functional.mse_loss(raw(x.double()).float(), y).backward()
        raw_opt.step()
    _assert_same_parameters(model, raw)
    assert model.l1.weight.dtype == torch.float64


def test_double_precision_init_contexts():
    fabric = _fabric(precision="64-true")
    with fabric.init_module():
        layer = nn.Linear(2, 2)
        inside = torch.get_default_dtype()
    assert layer.weight.dtype == torch.float64 and inside == torch.float64
    assert torch.get_default_dtype() == torch.float32
    with fabric.init_tensor():
        t = torch.zeros(3)
    assert t.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32
    # full precision leaves the default dtype alone
    with _fabric().init_module():
        assert nn.Linear(2, 2).weight.dtype == torch.float32


@pytest.mark.parametrize("context", ["init_module", "init_tensor", "forward"])
def test_default_dtype_restored_after_an_exception(context):
    fabric = _fabric(precision="64-true")

    class Boom(nn.Module):
        def forward(self, x):
            assert torch.get_default_dtype() == torch.float64
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        if context == "forward":
            fabric.setup(Boom())(torch.zeros(1))
        else:
            with getattr(fabric, context)():
                assert torch.get_default_dtype() == torch.float64
                raise ValueError("boom")
    assert torch.get_default_dtype() == torch.float32


class _ConstantInit(nn.Module):
    """Initialises its weight through torch.nn.init, as every built-in layer does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4096))
        self.register_buffer("ones", torch.ones(3))
        nn.init.constant_(self.weight, 7.25)


def test_empty_init_skips_parameter_initialisation():
    fabric = _fabric(precision="64-true")
    initialised = _ConstantInit()  # kept alive, so its memory cannot be handed to the next module
    assert bool((initialised.weight == 7.25).all())
    with fabric.init_module(empty_init=True):
        empty = _ConstantInit()
        torch.manual_seed(0)
        linear = nn.Linear(64, 64)
    assert empty.weight.dtype == torch.float64
    assert not bool((empty.weight == 7.25).all()), "nn.init.constant_ ran under empty_init=True"
    assert torch.equal(empty.ones, torch.ones(3, dtype=torch.float64))  # non-init tensor creation still runs
    torch.manual_seed(0)
    seeded = nn.Linear(64, 64).double()
    assert not torch.equal(linear.weight, seeded.weight)
    # afterwards, initialisation works again and the default dtype is back
    assert bool((_ConstantInit().weight == 7.25).all())
    assert torch.get_default_dtype() == torch.float32
    with fabric.init_module(empty_init=False):
        assert bool((_ConstantInit().weight == 7.25).all())


def test_empty_init_is_undone_after_an_exception():
    fabric = _fabric()
    with pytest.raises(RuntimeError, match="inside"), fabric.init_module(empty_init=True):
        raise RuntimeError("inside")
    assert bool((_ConstantInit().weight == 7.25).all())


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_an_unmarked_method_that_runs_submodules_with_gradients_raises_under_ddp() -> None:
    results = spawn_job("tests.distributed.test_wrappers:unmarked_methods", 2)
    for rank, seen in enumerate(results):
        assert seen["describe"] == "an agent"
        assert seen["act_no_grad"] == seen["marked"], seen
        message = seen["act_with_grad"]
        assert "Agent.act()" in message and "mark_forward_method('act')" in message and "torch.no_grad()" in message
        assert seen["hooks_left"] == 0, f"rank {rank} kept the guard's hooks"
    assert results[0]["grad"] == results[1]["grad"]


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).argmax(dim=-1)

    def describe(self) -> str:
        return "an agent"


def unmarked_methods(fabric) -> dict:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = fabric.setup(Agent())
    x = torch.full((2, 3), float(fabric.global_rank + 1))
    seen: dict = {"describe": model.describe()}  # no submodule runs: fine
    with torch.no_grad():
        seen["act_no_grad"] = model.act(x).tolist()  # submodules run, no gradients: fine
    try:
        model.act(x)
        seen["act_with_grad"] = "no error"
    except RuntimeError as err:
        seen["act_with_grad"] = str(err)
    seen["hooks_left"] = sum(len(m._forward_pre_hooks) for m in model.module.modules())
    model.mark_forward_method("act")
    out = model.act(x)  # through DDP's forward now
    seen["marked"] = out.tolist()
    loss = model(x).sum()
    fabric.backward(loss)
    seen["grad"] = model.module.body.weight.grad.sum().item()  # averaged over ranks: the same on both
    return seen
