"""Memory and forward time of a model quantised by ``BitsandbytesPrecision``, against the float model, on the CPU.

The model: 4 ``Linear(1024, 1024)`` layers. Memory: the bytes of its parameters, buffers and quantisation state
(4-bit absmax/code tensors, int8 row scales). Forward: a batch of 64 rows, median of 20 runs, in eval mode.

    python benchmarks/bitsandbytes_memory.py
"""

from __future__ import annotations

import statistics
import time

import torch

from fabric_lite import Fabric
from fabric_lite.plugins import BitsandbytesPrecision


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))


def _nbytes(module: torch.nn.Module) -> int:
    """Bytes of everything the model keeps: its state dict holds the quantisation state of the 4-bit and int8
    layers beside the packed weights (tensors counted once, by storage)."""
    seen: set[int] = set()
    total = 0
    for tensor in module.state_dict().values():
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in seen:
            seen.add(tensor.untyped_storage().data_ptr())
            total += tensor.untyped_storage().nbytes()
    return total


def _forward_ms(model: torch.nn.Module, x: torch.Tensor) -> float:
    times = []
    with torch.no_grad():
        model(x)  # warm-up (and, for 4-bit layers on AVX512-BF16 CPUs, the one-off repacking)
        for _ in range(20):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    x = torch.randn(64, 1024)
    rows = [("float32", Fabric(accelerator="cpu", devices=1))]
    rows += [
        (mode, Fabric(accelerator="cpu", devices=1, plugins=[BitsandbytesPrecision(mode)]))  # type: ignore[arg-type]
        for mode in ("int8", "nf4", "nf4-dq", "fp4")
    ]
    base_bytes = base_ms = 0.0
    print(f"{'precision':<10} {'MiB':>7} {'x fp32':>7} {'fwd ms':>7} {'x fp32':>7}")
    for name, fabric in rows:
        model = fabric.setup_module(_model())
        model.eval()
        nbytes, ms = _nbytes(model), _forward_ms(model, x)
        if name == "float32":
            base_bytes, base_ms = nbytes, ms
        print(f"{name:<10} {nbytes / 2**20:7.2f} {nbytes / base_bytes:7.3f} {ms:7.2f} {ms / base_ms:7.2f}")


if __name__ == "__main__":
    main()
