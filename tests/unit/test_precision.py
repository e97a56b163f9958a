"""Precision: every family on the CPU, single process (and on two ranks in test_precision_dist.py).

The float16 scaler runs on the CPU through an explicit ``MixedPrecision("16-mixed", "cpu")`` plugin (the
``precision="16-mixed"`` string maps to bf16 on the CPU, as in Lightning).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins.precision import (
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)
from fabric_lite.plugins.precision.utils import _ClassReplacementContextManager

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


class Probe(nn.Module):
    """Records the dtype of its input and of an intermediate result, as the forward sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen["input"] = x.dtype
        hidden = self.linear(x)
        self.seen["hidden"] = hidden.dtype
        self.seen["new_tensor"] = torch.zeros(1).dtype
        return hidden.tanh().sum(dim=1)


def fabric_for(precision: str) -> Fabric:
    if precision == "16-mixed-scaler":
        return Fabric(accelerator="cpu", devices=1, plugins=[MixedPrecision("16-mixed", "cpu")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Fabric(accelerator="cpu", devices=1, precision=precision)


# precision: (parameters, input seen by forward, intermediate, new tensor in forward, output, gradient)
DTYPES = {
    "32-true": (F32, F32, F32, F32, F32, F32),
    "64-true": (F64, F64, F64, F64, F32, F64),
    "bf16-mixed": (F32, BF16, BF16, F32, F32, F32),
    "16-mixed-scaler": (F32, F16, F16, F32, F32, F32),
    "16-true": (F16, F16, F16, F16, F32, F16),
    "bf16-true": (BF16, BF16, BF16, BF16, F32, BF16),
}


@pytest.mark.parametrize("precision", list(DTYPES))
def test_dtypes_of_parameters_inputs_outputs_and_gradients(precision: str) -> None:
    fabric = fabric_for(precision)
    probe = Probe()
    model, optimizer = fabric.setup(probe, torch.optim.SGD(probe.parameters(), lr=0.1))
    out = model(torch.randn(5, 4))
    fabric.backward(out.sum())
    params, seen_input, hidden, new_tensor, output, grad = DTYPES[precision]
    assert {p.dtype for p in probe.parameters()} == {params}
    assert probe.seen == {"input": seen_input, "hidden": hidden, "new_tensor": new_tensor}
    assert out.dtype == output
    assert {p.grad.dtype for p in probe.parameters()} == {grad}
    assert torch.get_default_dtype() == F32  # restored after the forward


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("32-true", F32), ("64-true", F64), ("bf16-mixed", F32), ("16-true", F16), ("bf16-true", BF16)],
)
def test_init_module_and_init_tensor_create_in_the_precision_dtype(precision: str, dtype: torch.dtype) -> None:
    fabric = fabric_for(precision)
    with fabric.init_module():
        layer = nn.Linear(3, 3)
    with fabric.init_tensor():
        tensor = torch.ones(2)
    assert layer.weight.dtype == dtype and tensor.dtype == dtype
    assert torch.get_default_dtype() == F32


def test_autocast_context_outside_the_forward() -> None:
    fabric = fabric_for("bf16-mixed")
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    with fabric.autocast():
        assert (a @ b).dtype == BF16
    assert (a @ b).dtype == F32


def _train(fabric: Fabric, steps: int = 10) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_bf16_mixed_losses_close_to_full_precision() -> None:
    full = _train(fabric_for("32-true"))
    mixed = _train(fabric_for("bf16-mixed"))
    assert mixed != full  # it really ran in bfloat16
    torch.testing.assert_close(torch.tensor(mixed), torch.tensor(full), rtol=2e-2, atol=2e-2)
    assert mixed[-1] < mixed[0]


def test_16_mixed_equals_autocast_and_grad_scaler_by_hand() -> None:
    """Bit for bit the loop one would write by hand with torch.autocast and torch.amp.GradScaler."""
    ours = _train(fabric_for("16-mixed-scaler"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    theirs = []
    for _ in range(10):
        with torch.autocast("cpu", dtype=F16):
            out = model(x.to(F16))
        loss = nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        theirs.append(loss.item())
    assert ours == theirs


def _scaler_setup() -> tuple[Fabric, nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    # a scale small enough that ordinary steps do not overflow in float16
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    net = nn.Linear(4, 2)
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert fabric.strategy.precision.scaler is scaler
    return fabric, model, optimizer, scaler


def test_scaler_skips_a_step_with_an_inf_gradient_and_lowers_the_scale() -> None:
    fabric, model, optimizer, scaler = _scaler_setup()
    net = model.module
    fabric.backward(model(torch.randn(3, 4)).sum())
    net.weight.grad[0, 0] = float("inf")  # injected
    before = net.weight.detach().clone()
    optimizer.step()
    assert torch.equal(net.weight, before)  # skipped
    assert scaler.get_scale() == 512.0  # halved
    optimizer.zero_grad()
    fabric.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    assert not torch.equal(net.weight, before)  # the next, finite step is taken
    assert scaler.get_scale() == 512.0


def test_clip_gradients_unscales_once_per_step() -> None:
    fabric, model, optimizer, scaler = _scaler_setup()
    net = model.module
    x = torch.randn(3, 4)
    fabric.backward(model(x).sum())
    scaled = net.weight.grad.clone()
    norm = fabric.clip_gradients(model, optimizer, max_norm=1e9)  # unscales, clips nothing
    torch.testing.assert_close(net.weight.grad, scaled / 1024.0)
    again = fabric.clip_gradients(model, optimizer, max_norm=1e9)  # no second unscale, no error
    torch.testing.assert_close(net.weight.grad, scaled / 1024.0)
    assert torch.equal(norm, again)
    optimizer.step()  # the scaler does not unscale again: the update uses the unscaled gradient once
    optimizer.zero_grad()
    fabric.backward(model(x).sum())
    fabric.clip_gradients(model, optimizer, clip_val=1e9)  # a new step: unscaled again
    assert net.weight.grad.abs().max() < scaled.abs().max()


def test_clip_gradients_with_a_scaler_does_not_raise_on_overflow() -> None:
    fabric, model, optimizer, scaler = _scaler_setup()
    fabric.backward(model(torch.randn(3, 4)).sum())
    model.module.weight.grad[0, 0] = float("inf")
    norm = fabric.clip_gradients(model, optimizer, max_norm=1.0)  # error_if_nonfinite=True by default
    assert not torch.isfinite(norm)
    optimizer.step()
    assert scaler.get_scale() == 512.0


def test_plain_loss_backward_is_caught_where_the_scaler_needs_fabric_backward() -> None:
    fabric, model, optimizer, _ = _scaler_setup()
    loss = model(torch.randn(3, 4)).sum()
    with pytest.raises(
        RuntimeError, match=r"requires you to call `fabric.backward\(loss\)` instead of `loss.backward\(\)`"
    ):
        loss.backward()
    fabric.backward(model(torch.randn(3, 4)).sum())  # fabric.backward still works afterwards


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "64-true"])
def test_plain_loss_backward_is_fine_where_nothing_needs_scaling(precision: str) -> None:
    fabric = fabric_for(precision)
    net = nn.Linear(4, 2)
    model = fabric.setup(net)
    model(torch.randn(3, 4)).sum().backward()
    assert net.weight.grad is not None


def test_scaler_state_is_saved_and_restored(tmp_path) -> None:
    fabric, model, optimizer, scaler = _scaler_setup()
    for step in range(3):
        fabric.backward(model(torch.randn(3, 4)).sum())
        if step == 1:
            model.module.weight.grad[0, 0] = float("nan")
        optimizer.step()
        optimizer.zero_grad()
    saved = scaler.state_dict()
    assert saved["scale"] == 512.0 and saved["_growth_tracker"] == 1
    path = tmp_path / "amp.ckpt"
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 3})

    other, model2, optimizer2, scaler2 = _scaler_setup()
    assert scaler2.state_dict() != saved
    state = {"model": model2, "optimizer": optimizer2, "step": 0}
    remainder = other.load(path, state)
    assert scaler2.state_dict() == saved
    assert remainder == {} and state["step"] == 3  # the scaler's entry is not handed back to the user
    assert "fabric_lite:precision" not in other.load(path)  # nor in a full load


def test_bf16_checkpoint_has_no_scaler_entry(tmp_path) -> None:
    fabric = fabric_for("bf16-mixed")
    model = fabric.setup(nn.Linear(2, 2))
    fabric.save(tmp_path / "c.ckpt", {"model": model})
    assert set(torch.load(tmp_path / "c.ckpt", weights_only=True)) == {"model"}


def test_lbfgs_with_a_scaler_is_refused() -> None:
    fabric = fabric_for("16-mixed-scaler")
    net = nn.Linear(2, 1)
    model, optimizer = fabric.setup(net, torch.optim.LBFGS(net.parameters()))
    fabric.backward(model(torch.randn(2, 2)).sum())
    with pytest.raises(TypeError, match="LBFGS"):
        optimizer.step()


@pytest.mark.parametrize(
    ("arguments", "cls", "fragment"),
    [
        ({"precision": "8-mixed"}, ValueError, "'8-mixed'"),
        ({"plugins": [MixedPrecision("bf16-mixed", "cpu")], "precision": "64-true"}, ValueError, "conflicts"),
        (
            {"plugins": [HalfPrecision("16-true"), DoublePrecision()]},
            ValueError,
            r"multiple values for Precision flags in `plugins` \(Precision: HalfPrecision, DoublePrecision\)",
        ),
    ],
)
def test_bad_precision_arguments(arguments: dict, cls: type[Exception], fragment: str) -> None:
    with pytest.raises(cls, match=fragment):
        Fabric(accelerator="cpu", devices=1, **arguments)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: MixedPrecision("32-true", "cpu"), "Precision must be '16-mixed' or 'bf16-mixed'"),  # type: ignore[arg-type]
        (lambda: MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu")), "does not use a scaler"),
        (lambda: HalfPrecision("bf16-mixed"), "must be one of"),  # type: ignore[arg-type]
    ],
)
def test_bad_plugin_arguments(make, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make()


def test_a_custom_precision_plugin_is_used() -> None:
    class Doubling(Precision):
        precision = "32-true"

        def convert_output(self, data):
            return data * 2

    fabric = Fabric(accelerator="cpu", devices=1, plugins=[Doubling()])
    net = nn.Linear(2, 2)
    model = fabric.setup(net)
    x = torch.randn(1, 2)
    torch.testing.assert_close(model(x), net(x) * 2)


def test_legacy_precision_names_map_like_lightning() -> None:
    with pytest.warns(UserWarning, match="historical"):
        assert Fabric(accelerator="cpu", devices=1, precision="bf16").strategy.precision.precision == "bf16-mixed"
    assert Fabric(accelerator="cpu", devices=1, precision=64).strategy.precision.precision == "64-true"
    assert Fabric(accelerator="cpu", devices=1, precision="32").strategy.precision.precision == "32-true"


@pytest.mark.parametrize(
    ("precision", "message"),
    [
        ("16", "Passed `MixedPrecision(precision='16')`. Precision must be '16-mixed' or 'bf16-mixed'"),
        (16, "Passed `MixedPrecision(precision=16)`. Precision must be '16-mixed' or 'bf16-mixed'"),
        ("bf16", "Passed `MixedPrecision(precision='bf16')`. Precision must be '16-mixed' or 'bf16-mixed'"),
    ],
)
def test_mixed_precision_errors_use_lightnings_words(precision: object, message: str) -> None:
    # Lightning's tests pin these phrases; ours add what to pass instead
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        MixedPrecision(precision, "cpu")  # type: ignore[arg-type]
    assert "legacy" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("`precision='bf16-mixed'` does not use a scaler, found scaler=")):
        MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))


class WithComplexAndIntegerBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("spectrum", torch.complex(torch.rand(5), torch.rand(5)).to(torch.complex128))
        self.register_buffer("steps", torch.arange(3))


@pytest.mark.parametrize(("precision", "dtype"), [("64-true", F64), ("16-true", F16), ("bf16-true", BF16)])
def test_true_precisions_cast_floating_tensors_only(precision: str, dtype: torch.dtype) -> None:
    # module.to(dtype=float64) would keep only the real part of a complex buffer (torch warns); the plugins keep it
    module = WithComplexAndIntegerBuffers()
    spectrum = module.spectrum.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Casting complex values to real discards the imaginary part"
        model = fabric_for(precision).setup(module)
    assert model.linear.weight.dtype == model.linear.bias.dtype == dtype
    assert model.spectrum.dtype == torch.complex128 and torch.equal(model.spectrum, spectrum)
    assert model.steps.dtype == torch.int64


@pytest.mark.parametrize(
    ("plugin", "dtype"),
    [
        (DoublePrecision(), F64),
        (HalfPrecision("16-true"), F16),
        (HalfPrecision("bf16-true"), BF16),
        (DeepSpeedPrecision("16-true"), F16),
        (DeepSpeedPrecision("bf16-true"), BF16),
        (FSDPPrecision("bf16-true"), BF16),
    ],
    ids=repr,
)
def test_every_converting_plugin_keeps_complex_tensors(plugin: Precision, dtype: torch.dtype) -> None:
    module = plugin.convert_module(WithComplexAndIntegerBuffers())
    assert module.linear.weight.dtype == dtype
    assert module.spectrum.dtype == torch.complex128 and module.steps.dtype == torch.int64


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-true", BF16), ("16-true", F16)])
def test_half_precision_names_its_dtype_as_lightning_does(precision: str, dtype: torch.dtype) -> None:
    assert HalfPrecision(precision)._desired_input_dtype is dtype  # type: ignore[arg-type]


def test_class_replacement_context_manager_swaps_and_restores() -> None:
    class Replacement(nn.Module):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__()

    original = nn.Linear
    swap = _ClassReplacementContextManager({"torch.nn.Linear": Replacement})
    assert swap._originals == {"torch.nn.Linear": original} and swap._modules == {"torch.nn.Linear": torch.nn}
    with swap:
        assert isinstance(nn.Linear(2, 2), Replacement)
    assert nn.Linear is original
    with pytest.raises(ZeroDivisionError), swap:
        _ = 1 / 0
    assert nn.Linear is original  # restored on error too
    with pytest.raises(ValueError, match="'Linear' is not a dotted path"):
        _ClassReplacementContextManager({"Linear": Replacement})
    with pytest.raises(AttributeError):
        _ClassReplacementContextManager({"torch.nn.NoSuchLayer": Replacement})
