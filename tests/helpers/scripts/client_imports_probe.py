"""Call the private names public clients import, with the same inputs, and print what they return as JSON: run with
Lightning Fabric (``lightning``) or fabric_lite (``fabric_lite``) and compare (tests/compat/test_client_imports.py).

python tests/helpers/scripts/client_imports_probe.py {lightning|fabric_lite} FOLDER
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import torch

PACKAGE = "lightning_fabric" if sys.argv[1] == "lightning" else "fabric_lite"
folder = Path(sys.argv[2])


def name(path: str) -> object:
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), attr)


def tensors(obj: object) -> object:
    """Tensors as [dtype, shape, values]: comparable as JSON."""
    if isinstance(obj, torch.Tensor):
        return [str(obj.dtype), list(obj.shape), obj.detach().flatten().tolist()]
    if isinstance(obj, dict):
        return {str(k): tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tensors(v) for v in obj]
    return obj if isinstance(obj, (int, float, str, bool, type(None))) else type(obj).__name__


out: dict[str, object] = {}

# utilities.load: a checkpoint read lazily, materialised, loaded into a module
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
torch.save({"model": module.state_dict(), "step": 7, "names": ["a", "b"]}, folder / "ckpt.pt")
lazy = name("utilities.load._lazy_load")(folder / "ckpt.pt")
not_yet = name("utilities.load._NotYetLoadedTensor")
weight = lazy["model"]["0.weight"]
out["lazy_types"] = sorted({type(v).__name__ for v in lazy["model"].values()})
out["lazy_is_not_yet"] = all(isinstance(v, not_yet) for v in lazy["model"].values())
out["lazy_meta"] = [str(weight.dtype), list(weight.shape), weight.ndim, weight.requires_grad]
out["lazy_plain"] = [lazy["step"], lazy["names"]]
out["lazy_torch_function"] = tensors(torch.add(weight, weight).sum(0))  # (torch.cat of a list recurses in Lightning)
out["lazy_to"] = tensors(weight.to(torch.float64)[0])
other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
other.load_state_dict(lazy["model"])
out["lazy_load_state_dict"] = tensors(other.state_dict())
out["materialized"] = tensors(name("utilities.load._materialize_tensors")(lazy))
source = {"model": module.state_dict(), "step": 3, "extra": 1}
destination: dict[str, object] = {"model": other, "step": 0}
name("utilities.load._move_state_into")(source, destination, {"model", "step"})
out["move_state_into"] = [sorted(source), sorted(destination), destination["step"], destination["model"] is other]
out["metadata_filename"] = name("utilities.load._METADATA_FILENAME")
try:
    name("utilities.load._lazy_load")(folder / "missing.pt")
except FileNotFoundError as err:
    out["lazy_missing"] = type(err).__name__

# utilities.init: meta-device modules materialised by reset_parameters, one module at a time
with torch.device("meta"):
    meta = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
out["has_meta"] = name("utilities.init._has_meta_device_parameters_or_buffers")(meta)
torch.manual_seed(1)
name("utilities.init._materialize_meta_tensors")(meta, torch.device("cpu"))
out["materialize_meta"] = tensors(meta.state_dict())
out["has_meta_after"] = name("utilities.init._has_meta_device_parameters_or_buffers")(meta)
torch.manual_seed(2)
fresh = torch.get_rng_state()
with name("utilities.init._EmptyInit")(enabled=True):
    torch.nn.Linear(2, 2)  # no initialisation: no random numbers drawn
out["empty_init_draws_nothing"] = torch.equal(torch.get_rng_state(), fresh)
try:
    name("utilities.init._has_meta_device_parameters_or_buffers")(3)
except TypeError as err:
    out["has_meta_type_error"] = type(err).__name__

# utilities.testing, plugins.precision.bitsandbytes, utilities.imports
runif = name("utilities.testing._runif_reasons")
out["runif"] = [
    runif(min_cuda_gpus=1),
    runif(min_torch="99.0"),
    runif(max_torch="1.0"),
    runif(min_python="3.8"),
    runif(standalone=True),
    runif(mps=False),
    runif(linux_only=True),
    runif(skip_windows=True),
]
available = name("plugins.precision.bitsandbytes._BITSANDBYTES_AVAILABLE")
out["bitsandbytes_available_iff_installed"] = bool(available) == (importlib.util.find_spec("bitsandbytes") is not None)
out["imports"] = [
    bool(name(f"utilities.imports.{flag}"))
    for flag in ("_IS_WINDOWS", "_IS_INTERACTIVE", "_TORCH_GREATER_EQUAL_2_2", "_TORCH_GREATER_EQUAL_2_3")
]

# utilities.logger
params = {"lr": 0.1, "act": torch.nn.ReLU, "fn": lambda: 5, "nested": {"a": {"b": 1}}, "l": [{"x": 2}], "n": [1, 2]}


@dataclass
class Config:
    width: int = 3


out["convert_params"] = [
    name("utilities.logger._convert_params")(Namespace(a=1)),
    name("utilities.logger._convert_params")(None),
]
out["sanitize_callable"] = tensors(name("utilities.logger._sanitize_callable_params")(dict(params)))
out["flatten"] = tensors(name("utilities.logger._flatten_dict")({**params, "cfg": Config(), "ns": Namespace(z=1)}))
out["sanitize_params"] = name("utilities.logger._sanitize_params")({"a": 1, "b": [1, 2], "c": Namespace(x=1)})
out["add_prefix"] = [
    dict(name("utilities.logger._add_prefix")({"loss": 1.0}, "train", "-")),
    dict(name("utilities.logger._add_prefix")({"loss": 1.0}, "", "-")),
]

# utilities.seed
collect, restore = name("utilities.seed._collect_rng_states"), name("utilities.seed._set_rng_states")
states = collect()
draws = [torch.rand(2).tolist(), __import__("random").random(), __import__("numpy").random.rand()]
restore(states)
out["rng_roundtrip"] = draws == [
    torch.rand(2).tolist(),
    __import__("random").random(),
    __import__("numpy").random.rand(),
]
out["rng_keys"] = sorted(collect(include_cuda=False))

# utilities.optimizer
opt = torch.optim.Adam(module.parameters())
module(torch.randn(2, 3)).sum().backward()
opt.step()
name("utilities.optimizer._optimizers_to_device")([opt], "cpu")
out["optimizer_state"] = sorted(next(iter(opt.state.values())))

# strategies.strategy
target: dict[str, object] = {}
apply = name("strategies.strategy._apply_filter")
apply("model", {"model": lambda k, v: k.startswith("0.")}, module.state_dict(), target)
apply("step", {"model": lambda k, v: True}, 5, target)
apply("model2", {"model2": lambda k, v: False}, {"a": 1}, target)
out["apply_filter"] = [sorted(target), sorted(target["model"]), target["step"]]  # type: ignore[call-overload]
validate = name("strategies.strategy._validate_keys_for_strict_loading")
validate(["a"], ["a", "b"], strict=True)
validate(["c"], ["a"], strict=False)
try:
    validate(["c"], ["a"], strict=True)
except KeyError as err:
    out["validate_keys"] = type(err).__name__

# utilities.distributed, utilities.cloud_io, loggers.logger, accelerators.cuda, collectives
backend = name("utilities.distributed._get_default_process_group_backend_for_device")
out["backend"] = [backend(torch.device("cpu")), backend(torch.device("cuda", 0))]
out["distributed_is_initialized"] = name("utilities.distributed._distributed_is_initialized")()
out["sync_ddp_if_available"] = tensors(name("utilities.distributed._sync_ddp_if_available")(torch.tensor([1.0, 2.0])))
out["group_world"] = name("utilities.distributed.group") is torch.distributed.group
name("utilities.cloud_io._atomic_save")({"x": torch.arange(3)}, folder / "atomic.pt")
out["cloud_load"] = tensors(name("utilities.cloud_io._load")(folder / "atomic.pt"))
with open(folder / "atomic.pt", "rb") as f:
    out["cloud_load_file"] = tensors(name("utilities.cloud_io._load")(f))
out["cuda"] = [name("accelerators.cuda.num_cuda_devices")(), name("accelerators.cuda.is_cuda_available")()]
out["default_pg_timeout"] = name("plugins.collectives.torch_collective.default_pg_timeout").total_seconds()


class Experiments:
    @property
    @name("loggers.logger.rank_zero_experiment")
    def experiment(self) -> str:
        return "real"


out["rank_zero_experiment"] = Experiments().experiment
print("PROBE " + json.dumps(out, sort_keys=True, default=str))
