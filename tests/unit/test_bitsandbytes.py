"""BitsandbytesPrecision (8- and 4-bit weights) on the CPU, with the real bitsandbytes.

Lightning Fabric refuses this plugin on anything but CUDA ("Bitsandbytes is only supported on CUDA GPUs."), so no
side-by-side run with Lightning is possible on the CPU; the CUDA test at the end runs the same checks on a GPU.

Error bounds (relative Frobenius error of a layer's output against the float layer, weights drawn by PyTorch's
default kaiming-uniform init, Gaussian inputs). Quantisation errors are independent across weights, so the output
error is the weight error:

* int8, training path (weights dequantised, activations exact): row-wise absmax to 127 levels, a uniform weight
  error of step/sqrt(12) against a weight RMS of absmax/sqrt(3): (2/254)/sqrt(12)*sqrt(3) = 1/254 = 0.0039
  (measured 0.0040). Bound [0.002, 0.008]: an unquantised layer (error 0, or ~5e-4 from float16 rounding) fails.
* int8, inference path (LLM.int8(): activations quantised row-wise too; Gaussian rows of 256 have absmax ~3 sigma):
  measured 0.008-0.011. Bound [0.004, 0.02].
* nf4/fp4 (16 levels per block of 64, absmax-scaled): measured 0.090 (nf4) and 0.111 (fp4), +0.004 with bfloat16
  compute. Bounds [0.05, 0.15] and [0.06, 0.18]: an unquantised layer, or an 8-bit one, fails the lower bound.
  nf4 and fp4 are too close to tell apart by error, so the tests check the quantisation state's type as well.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from tests.helpers.harness import run_python

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed (pip install bitsandbytes)"
)

MODES = ["nf4", "nf4-dq", "fp4", "fp4-dq", "int8", "int8-training"]
#: (lower, upper) relative output error per mode, in training mode (see the module docstring)
BOUNDS = {
    "nf4": (0.05, 0.15),
    "nf4-dq": (0.05, 0.15),
    "fp4": (0.06, 0.18),
    "fp4-dq": (0.06, 0.18),
    "int8": (0.002, 0.008),
    "int8-training": (0.002, 0.008),
}
INT8_EVAL_BOUNDS = (0.004, 0.02)


def plugin(mode: str, **kwargs: object) -> object:
    from fabric_lite.plugins import BitsandbytesPrecision

    return BitsandbytesPrecision(mode, **kwargs)  # type: ignore[arg-type]


def fabric(mode: str, **kwargs: object) -> Fabric:
    return Fabric(accelerator="cpu", devices=1, plugins=[plugin(mode, **kwargs)])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # type: ignore[no-any-return]


def plugin_dtype(module: object) -> torch.dtype:
    return module._strategy.precision.dtype  # type: ignore[attr-defined, no-any-return]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.detach().float() - ref.detach().float()).norm() / ref.detach().float().norm())


def quant_kind(layer: nn.Module) -> tuple[str, bool] | str:
    """What a layer's weight really is: ("nf4"/"fp4", double-quantised?) for 4-bit, "int8", or "float"."""
    weight = layer.weight
    state = getattr(weight, "quant_state", None)
    if state is not None:
        return (state.quant_type, bool(state.nested))
    return "int8" if weight.dtype == torch.int8 else "float"


EXPECTED_KIND = {
    "nf4": ("nf4", False),
    "nf4-dq": ("nf4", True),
    "fp4": ("fp4", False),
    "fp4-dq": ("fp4", True),
    "int8": "int8",
    "int8-training": "float",  # float weights, quantised in every forward
}


# ------------------------------------------------------------------ construction
def test_without_bitsandbytes_the_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['bitsandbytes'] = None\n"
        "import fabric_lite, fabric_lite.plugins\n"
        "from fabric_lite.plugins import BitsandbytesPrecision\n"
        "try:\n    BitsandbytesPrecision('nf4')\n"
        "except ModuleNotFoundError as err:\n    print('ERR', err)\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ERR" in done.stdout and "pip install bitsandbytes" in done.stdout, done.stdout


def test_import_does_not_load_bitsandbytes() -> None:
    code = (
        "import sys, fabric_lite, fabric_lite.plugins, fabric_lite.plugins.precision\n"
        "from fabric_lite.plugins import BitsandbytesPrecision\n"
        "print('before', 'bitsandbytes' in sys.modules)\n"
        "BitsandbytesPrecision('int8')\n"
        "print('after', 'bitsandbytes' in sys.modules)\n"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    assert "before False" in done.stdout and "after True" in done.stdout, done.stdout


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"mode='nf8'.*'nf4', 'nf4-dq', 'fp4', 'fp4-dq', 'int8', 'int8-training'"):
        plugin("nf8")
    with pytest.raises(ValueError, match=r"'int8' only works with `dtype=torch.float16`"):
        plugin("int8", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"floating torch\.dtype"):
        plugin("nf4", dtype=torch.int8)
    assert plugin("int8-training").dtype is torch.float16  # type: ignore[attr-defined]
    assert plugin("nf4").dtype is torch.bfloat16  # type: ignore[attr-defined]  # no CUDA here
    assert plugin("fp4", dtype=torch.float32).dtype is torch.float32  # type: ignore[attr-defined]


def test_a_model_without_linear_layers_is_refused() -> None:
    with pytest.raises(TypeError, match="no Linear layers"):
        fabric("nf4").setup_module(nn.Conv1d(2, 2, 1))


def test_fsdp_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot be used with the FSDP strategy"):
        Fabric(accelerator="cpu", devices=1, strategy="fsdp", plugins=[plugin("nf4")])


# ------------------------------------------------------------------ setup: layers, forward, backward
@pytest.mark.parametrize("mode", MODES)
def test_setup_replaces_linear_layers_except_ignored_ones(mode: str) -> None:
    torch.manual_seed(0)
    model = Net()
    bias = model.body[0].bias
    wrapped = fabric(mode, ignore_modules={"head"}).setup_module(model)
    for layer in (model.body[0], model.body[2]):
        assert type(layer).__name__ != "Linear" and isinstance(layer, nn.Linear)
        assert quant_kind(layer) == EXPECTED_KIND[mode]
        assert layer.weight.requires_grad is (mode == "int8-training")  # the quantised base is frozen
    assert type(model.head) is nn.Linear  # ignored: left unquantised, in the compute dtype like the inputs
    assert model.head.weight.dtype is plugin_dtype(wrapped)
    assert model.body[0].bias is bias  # the same Parameter: an optimizer holding it keeps working
    assert wrapped(torch.randn(2, 32)).dtype is torch.float32  # outputs back in the default dtype


def test_setup_casts_floating_tensors_only() -> None:
    # the rest of the model goes to the compute dtype; a complex buffer must keep its imaginary part
    model = Net()
    model.register_buffer("spectrum", torch.complex(torch.rand(4), torch.rand(4)).to(torch.complex128))
    model.register_buffer("steps", torch.arange(3))
    model.register_buffer("scale", torch.ones(2))
    spectrum = model.spectrum.clone()
    wrapped = fabric("nf4").setup_module(model)
    assert model.spectrum.dtype is torch.complex128 and torch.equal(model.spectrum, spectrum)
    assert model.steps.dtype is torch.int64
    assert model.scale.dtype is plugin_dtype(wrapped)


@pytest.mark.parametrize("mode", MODES)
def test_forward_is_within_the_quantisation_error_of_the_float_layer(mode: str) -> None:
    torch.manual_seed(0)
    reference = nn.Linear(256, 128)
    x = torch.randn(32, 256)
    expected = reference(x).detach()
    layer = nn.Linear(256, 128)
    layer.load_state_dict(reference.state_dict())
    wrapped = fabric(mode).setup_module(nn.Sequential(layer))  # a root Linear is left as it is, as in Lightning
    assert quant_kind(wrapped.module[0]) == EXPECTED_KIND[mode]
    low, high = BOUNDS[mode]
    assert low < rel_error(wrapped(x), expected) < high
    wrapped.eval()
    with torch.no_grad():
        low, high = INT8_EVAL_BOUNDS if mode == "int8" else BOUNDS[mode]
        assert low < rel_error(wrapped(x), expected) < high  # int8-training in eval: no CPU kernel in bitsandbytes


@pytest.mark.parametrize("mode", MODES)
def test_setup_without_the_move_leaves_float_weights_until_to_device(mode: str) -> None:
    """``setup_module(move_to_device=False)`` replaces the layers but, as in Lightning, quantises nothing: the move
    does (``fabric.to_device``), and the result is the model that ``setup_module`` would have given."""
    x = torch.randn(2, 32)
    torch.manual_seed(0)
    f = fabric(mode)
    model = Net()
    wrapped = f.setup_module(model, move_to_device=False)
    assert type(model.body[0]).__name__ != "Linear"  # replaced already
    assert quant_kind(model.body[0]) == "float" and model.body[0].weight.dtype is torch.float32  # not quantised
    assert f.to_device(wrapped) is wrapped
    assert quant_kind(model.body[0]) == quant_kind(model.body[2]) == EXPECTED_KIND[mode]
    torch.manual_seed(0)
    moved = f.setup_module(Net())
    assert torch.equal(wrapped(x), moved(x))


@pytest.mark.parametrize("mode", MODES)
def test_backward_reaches_the_adapter_and_the_input_not_the_frozen_base(mode: str) -> None:
    torch.manual_seed(0)
    reference = nn.Linear(64, 64)
    base = nn.Sequential(nn.Linear(64, 64))
    base[0].load_state_dict(reference.state_dict())
    f = fabric(mode)
    base = f.setup_module(base)
    for p in base.parameters():
        p.requires_grad_(False)  # what a fine-tuning script does: freeze the base (the bias too)
    adapter = f.setup_module(nn.Linear(64, 64, bias=False))  # a root Linear: not replaced (as in Lightning)
    assert quant_kind(adapter.module) == "float"
    x = torch.randn(8, 64, requires_grad=True)
    f.backward((base(x) + adapter(x)).pow(2).mean())
    assert adapter.weight.grad is not None and adapter.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in base.parameters())
    # the input's gradient went through the quantised layer's backward: the float one's, within its error. The
    # exact adapter's share dilutes the layer's error (measured 0.064 nf4, 0.078 fp4, 0.0028 int8: about 0.7x the
    # forward's), so the lower bound is half the forward's: a backward through unquantised weights fails it
    x_float = x.detach().clone().requires_grad_()
    (reference(x_float) + adapter.module.float()(x_float)).pow(2).mean().backward()
    low, high = BOUNDS[mode]
    assert x.grad is not None and low / 2 < rel_error(x.grad, x_float.grad) < high  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["nf4", "int8"])
def test_lora_style_fine_tune_lowers_the_loss_and_leaves_the_base_untouched(mode: str) -> None:
    class LoRALinear(nn.Module):
        """A frozen (quantised) base plus a trainable low-rank update B @ A, B starting at zero."""

        def __init__(self, n: int, rank: int = 4) -> None:
            super().__init__()
            self.base = nn.Linear(n, n)
            self.a = nn.Parameter(torch.randn(rank, n) / math.sqrt(n))
            self.b = nn.Parameter(torch.zeros(n, rank))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + x @ self.a.t() @ self.b.t()  # type: ignore[no-any-return]

    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(32), nn.Tanh(), LoRALinear(32))
    for name, p in model.named_parameters():
        p.requires_grad_(".base." not in name)
    f = fabric(mode)
    model = f.setup_module(model)
    # the adapters are cast to the compute dtype (float16 for int8), where Adam's default eps (1e-8) rounds to 0
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = f.setup_optimizers(torch.optim.Adam(trainable, lr=1e-2, eps=1e-4))
    # the quantised weights and their quantisation state (the bias is cast to the input's dtype in the forward)
    base_state = {k: v.clone() for k, v in model.state_dict().items() if ".base." in k and not k.endswith("bias")}
    x, target = torch.randn(64, 32), torch.randn(64, 32)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        f.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_state.items())  # the quantised weights never move


def test_int8_training_weights_are_trainable() -> None:
    torch.manual_seed(0)
    f = fabric("int8-training")
    model = f.setup_module(nn.Linear(16, 16))
    optimizer = f.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()
    f.backward(model(torch.randn(4, 16)).pow(2).sum())
    optimizer.step()
    assert not torch.equal(model.weight.detach(), before)


# ------------------------------------------------------------------ init_module
@pytest.mark.parametrize("mode", ["nf4-dq", "int8"])
def test_init_module_creates_quantised_layers_directly(mode: str) -> None:
    f = fabric(mode)
    with f.init_module():
        model = Net()
    assert torch.nn.Linear is nn.Linear and nn.Linear.__name__ == "Linear"  # restored on exit
    for layer in (model.body[0], model.body[2], model.head):
        assert quant_kind(layer) == EXPECTED_KIND[mode]  # quantised at creation, before setup
        assert layer.bias.dtype is f._strategy.precision.dtype  # type: ignore[attr-defined]
    wrapped = f.setup_module(model)
    assert quant_kind(model.head) == EXPECTED_KIND[mode]
    assert torch.isfinite(wrapped(torch.randn(2, 32))).all()


def test_init_module_restores_linear_on_error_and_refuses_ignore_modules() -> None:
    f = fabric("nf4")
    with pytest.raises(ZeroDivisionError), f.init_module():
        _ = 1 / 0
    assert type(nn.Linear(2, 2)) is nn.Linear and nn.Linear.__module__ == "torch.nn.modules.linear"
    with pytest.raises(RuntimeError, match="not supported when used with"):
        fabric("nf4", ignore_modules={"head"}).init_module()


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("mode", MODES)
def test_save_and_load_restore_the_quantised_model_exactly(mode: str, tmp_path: object) -> None:
    x = torch.randn(4, 32)
    torch.manual_seed(0)
    f = fabric(mode)
    model = f.setup_module(Net())
    expected = model(x)
    f.save(tmp_path / "ckpt.pt", {"model": model})  # type: ignore[operator]

    torch.manual_seed(1)  # other float weights: the load must replace every quantised value and scale
    other = f.setup_module(Net())
    assert not torch.equal(other(x), expected)
    f.load(tmp_path / "ckpt.pt", {"model": other})  # type: ignore[operator]
    assert torch.equal(other(x), expected)
    saved, loaded = model.state_dict(), other.state_dict()
    assert saved.keys() == loaded.keys()
    for key, value in saved.items():
        assert torch.equal(loaded[key], value) if isinstance(value, torch.Tensor) else loaded[key] == value, key
    if mode.startswith(("nf4", "fp4")):
        assert any(key.endswith(".absmax") for key in saved)  # the 4-bit quantisation state is in the checkpoint
    if mode == "int8":
        assert "body.0.SCB" in saved and saved["body.0.weight"].dtype is torch.int8


@pytest.mark.parametrize("mode", ["nf4", "int8"])
def test_a_float_checkpoint_is_quantised_on_load(mode: str) -> None:
    torch.manual_seed(0)
    source = Net()
    direct = fabric(mode).setup_module(Net())
    direct.load_state_dict(source.state_dict())  # float weights into a quantised model
    torch.manual_seed(0)
    quantised_at_setup = fabric(mode).setup_module(Net())
    x = torch.randn(4, 32)
    assert torch.equal(direct(x), quantised_at_setup(x))


# ------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_setup_forward_and_round_trip(mode: str, tmp_path: object) -> None:
    torch.manual_seed(0)
    reference = nn.Linear(256, 128).cuda()
    x = torch.randn(32, 256, device="cuda")
    expected = reference(x).detach()
    f = Fabric(accelerator="cuda", devices=1, plugins=[plugin(mode)])
    layer = nn.Linear(256, 128)
    layer.load_state_dict(reference.state_dict())
    model = f.setup_module(nn.Sequential(layer))  # a root Linear is left as it is, as in Lightning
    assert quant_kind(model.module[0]) == EXPECTED_KIND[mode]
    assert model.module[0].weight.device.type == "cuda"  # quantised when moved to the device
    assert rel_error(model(x), expected) < 2 * BOUNDS[mode][1]
    with f.init_module():
        created = nn.Linear(256, 128)
    assert created.weight.device.type == "cuda" and quant_kind(created) == EXPECTED_KIND[mode]
    f.save(tmp_path / "ckpt.pt", {"model": model})  # type: ignore[operator]
    other = f.setup_module(nn.Sequential(nn.Linear(256, 128)))
    f.load(tmp_path / "ckpt.pt", {"model": other})  # type: ignore[operator]
    assert torch.equal(other(x), model(x))
