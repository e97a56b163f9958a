"""CUDA checks, one process each (run by tests/test_cuda.py on a machine with a GPU).

    python tests/scripts/cuda_checks.py CHECK
prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric


def emit(result: dict) -> None:
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())


def single_device() -> dict:
    fabric = Fabric(accelerator="cuda", devices=1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(0)
    loader = fabric.setup_dataloaders(
        DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=16)
    )
    batch_devices, losses = set(), []
    for x, y in loader:
        batch_devices.update({str(x.device), str(y.device)})
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    state_devices = {
        str(v.device) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    }
    with fabric.init_module():
        fresh = nn.Linear(2, 2)
    with fabric.init_tensor():
        tensor = torch.zeros(3)
    return {
        "device": str(fabric.device),
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "batch_devices": sorted(batch_devices),
        "state_devices": sorted(state_devices),
        "init_module": str(fresh.weight.device),
        "init_tensor": str(tensor.device),
        "loss_went_down": losses[-1] < losses[0],
        "to_device": str(fabric.to_device({"a": torch.ones(1)})["a"].device),
    }


def double_precision() -> dict:
    fabric = Fabric(accelerator="cuda", devices=1, precision="64-true")
    model = fabric.setup(nn.Linear(3, 1))
    out = model(torch.ones(2, 3, device=fabric.device))
    return {"param": str(next(model.parameters()).dtype), "out": str(out.dtype), "device": str(out.device)}


def nccl_world_size_one() -> dict:
    fabric = Fabric(accelerator="cuda", devices=1, strategy="ddp")
    fabric.launch()
    import torch.distributed as dist

    model = fabric.setup(nn.Linear(4, 2))
    out = model(torch.ones(3, 4, device=fabric.device)).sum()
    fabric.backward(out)
    reduced = fabric.all_reduce({"x": torch.tensor([1.0, 3.0], device=fabric.device), "n": 3}, reduce_op="mean")
    flags = fabric.all_reduce(torch.tensor([True, False], device=fabric.device), reduce_op="sum")
    gathered = fabric.all_gather(torch.arange(3, device=fabric.device))
    fabric.barrier()
    sent = fabric.broadcast(torch.arange(4, device=fabric.device), src=0)
    obj = fabric.broadcast({"k": 1}, src=0)
    return {
        "backend": dist.get_backend(),
        "world": fabric.world_size,
        "strategy": type(fabric.strategy).__name__,
        "module": type(model._forward_module).__name__,
        "reduced": [reduced["x"].tolist(), reduced["n"].item(), str(reduced["n"].dtype), str(reduced["x"].device)],
        "flags": [flags.tolist(), str(flags.dtype)],
        "gathered": [list(gathered.shape), gathered.tolist()],
        "broadcast": [sent.tolist(), str(sent.device), obj],
        "decision": fabric.reduce_boolean_decision(True),
        "grad_device": str(next(model.parameters()).grad.device),
    }


def checkpoint_round_trip() -> dict:
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "gpu.ckpt")
    gpu = Fabric(accelerator="cuda", devices=1)
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    model, optimizer = gpu.setup(net, torch.optim.Adam(net.parameters(), lr=0.1))
    gpu.backward(model(torch.ones(2, 3, device=gpu.device)).sum())
    optimizer.step()
    cuda_rng = torch.cuda.get_rng_state()
    gpu.save(path, {"model": model, "optimizer": optimizer, "cuda_rng": cuda_rng, "step": 1})
    expected = {k: v.cpu() for k, v in net.state_dict().items()}
    # load on the CPU
    cpu = Fabric(accelerator="cpu", devices=1)
    cpu_net = nn.Linear(3, 3)
    cpu_model, cpu_opt = cpu.setup(cpu_net, torch.optim.Adam(cpu_net.parameters(), lr=0.1))
    state = {"model": cpu_model, "optimizer": cpu_opt, "step": 0}
    remainder = cpu.load(path, state)
    same_on_cpu = all(torch.equal(cpu_net.state_dict()[k], v) for k, v in expected.items())
    torch.cuda.set_rng_state(remainder["cuda_rng"])
    restored_rng = torch.equal(torch.cuda.get_rng_state(), cuda_rng)
    # and back onto the GPU
    back = nn.Linear(3, 3)
    gpu_model = gpu.setup(back)
    gpu.load(path, {"model": gpu_model}, strict=False)
    same_on_gpu = all(torch.equal(back.state_dict()[k].cpu(), v) for k, v in expected.items())
    return {
        "same_on_cpu": same_on_cpu,
        "same_on_gpu": same_on_gpu,
        "step": state["step"],
        "rng_restored": restored_rng,
        "opt_state_device": sorted(
            {str(v.device) for s in cpu_opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}
        ),
    }


def fork_after_cuda() -> dict:
    torch.zeros(1, device="cuda")  # initialises CUDA in this process
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_fork")
    try:
        fabric.launch(lambda f: None)
    except RuntimeError as err:
        return {"raised": "RuntimeError", "message": str(err)}
    return {"raised": None}


def auto_accelerator() -> dict:
    fabric = Fabric()
    all_gpus = Fabric(accelerator="cuda", devices=-1)
    return {
        "accelerator": type(fabric.accelerator).__name__,
        "device": str(fabric.device),
        "all_devices": all_gpus.world_size if all_gpus.strategy.is_parallel else 1,
        "count": torch.cuda.device_count(),
    }


def every_precision() -> dict:
    """Each precision on one GPU, single device and DDP at world size 1 over NCCL."""
    out = {}
    for strategy in ("single_device", "ddp"):
        for precision in ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"):
            fabric = Fabric(accelerator="cuda", devices=1, strategy=strategy, precision=precision)
            fabric.launch()
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
            seen = {}
            net[0].register_forward_hook(lambda module, inputs, output: seen.update(inner=str(output.dtype)))
            losses = []
            for _ in range(5):
                output = model(torch.randn(4, 8, device=fabric.device))
                loss = output.float().pow(2).mean()
                optimizer.zero_grad()
                fabric.backward(loss)
                optimizer.step()
                losses.append(loss.item())
            scaler = getattr(fabric.strategy.precision, "scaler", None)
            out[f"{strategy}/{precision}"] = {
                "param": str(next(net.parameters()).dtype),
                "grad": str(next(net.parameters()).grad.dtype),
                "inner": seen["inner"],
                "output": str(output.dtype),
                "finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
                "scaler": scaler is not None,
            }
            fabric.strategy.teardown()
    return out


def scaler_on_cuda() -> dict:
    """16-mixed on CUDA: a step with an inf gradient is skipped and the scale halved; the state round-trips."""
    fabric = Fabric(accelerator="cuda", devices=1, precision="16-mixed")
    net = nn.Linear(4, 2)
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    scaler = fabric.strategy.precision.scaler
    fabric.backward(model(torch.randn(3, 4, device=fabric.device)).sum())
    start = scaler.get_scale()
    net.weight.grad[0, 0] = float("inf")
    before = net.weight.detach().clone()
    optimizer.step()
    skipped = torch.equal(before, net.weight)
    halved = scaler.get_scale() == start / 2
    folder = tempfile.mkdtemp()
    fabric.save(os.path.join(folder, "s.ckpt"), {"model": model})
    other = Fabric(accelerator="cuda", devices=1, precision="16-mixed")
    other_model = other.setup(nn.Linear(4, 2))
    other.load(os.path.join(folder, "s.ckpt"), {"model": other_model})
    return {
        "device": scaler._device,
        "skipped": skipped,
        "halved": halved,
        "restored": other.strategy.precision.scaler.state_dict() == scaler.state_dict(),
    }


def _collectives_without_sync(fabric: Fabric) -> dict:
    import torch.distributed as dist

    from fabric_lite.utilities import _collectives

    x = torch.arange(4.0, device=fabric.device)
    metrics = {"loss": torch.tensor(1.0, device=fabric.device), "n": torch.ones(3, device=fabric.device)}
    for _ in range(3):  # warm: NCCL's first collectives may allocate
        fabric.all_reduce(x.clone(), reduce_op="sum")
        fabric.all_gather(x)
        fabric.barrier()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronisation below raises
    try:
        reduced = fabric.all_reduce(x.clone(), reduce_op="sum")
        fabric.all_reduce(metrics, reduce_op="mean")
        gathered = fabric.all_gather(x)
        fabric.barrier()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {
        "world": fabric.world_size,
        "host_checks": _collectives.host_check_group(None) is not None,
        "backend": dist.get_backend(),
        "reduced": reduced.tolist(),
        "gathered": list(gathered.shape),
    }


def collectives_without_sync_one_gpu() -> dict:
    fabric = Fabric(accelerator="cuda", devices=1, strategy="ddp")
    fabric.launch()
    return _collectives_without_sync(fabric)


def collectives_without_sync_two_gpus() -> dict:
    fabric = Fabric(accelerator="cuda", devices=2, strategy="ddp_spawn")
    return fabric.launch(_collectives_without_sync)  # type: ignore[no-any-return]


CHECKS = {
    f.__name__: f
    for f in (
        collectives_without_sync_one_gpu,
        collectives_without_sync_two_gpus,
        single_device,
        double_precision,
        nccl_world_size_one,
        checkpoint_round_trip,
        fork_after_cuda,
        auto_accelerator,
        every_precision,
        scaler_on_cuda,
    )
}

if __name__ == "__main__":
    emit(CHECKS[sys.argv[1]]())
