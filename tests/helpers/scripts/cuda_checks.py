"""CUDA checks, one process each (run by tests/gpu/test_cuda.py on a machine with a GPU).

    python tests/helpers/scripts/cuda_checks.py CHECK
prints ``RESULT {json}``.
"""

from __future__ import annotations

import copy
import getpass
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
    """Forking workers that would use CUDA after CUDA was initialised here is refused; CPU workers never touch it."""
    torch.zeros(1, device="cuda")  # initialises CUDA in this process
    cpu_result = Fabric(accelerator="cpu", devices=2, strategy="ddp_fork").launch(lambda f: f.global_rank)
    fabric = Fabric(accelerator="cuda", devices=1, strategy="ddp_fork")
    try:
        fabric.launch(lambda f: None)
    except RuntimeError as err:
        return {"raised": "RuntimeError", "message": str(err), "cpu_workers": cpu_result}
    return {"raised": None, "cpu_workers": cpu_result}


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
        "host_checks": fabric.strategy._checked(None).check_group is not None,
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


def compiled_on_gpu() -> dict:
    """A ``torch.compile``d model set up on one GPU, on a single device and then under DDP over NCCL (world size 1):
    set up uncompiled, compiled again around the strategy's module with inductor, losses equal to eager."""
    from fabric_lite._compile import is_compiled
    from tests.helpers.jobs.compile_jobs import STEPS, Net, batch

    result: dict = {}
    for strategy in ("single_device", "ddp"):
        fabric = Fabric(accelerator="cuda", devices=1, strategy=strategy)
        fabric.launch()
        torch.manual_seed(0)
        template = Net()
        runs, calls = {}, {}
        for compiled in (False, True):
            net = copy.deepcopy(template)
            model, optimizer = fabric.setup(
                torch.compile(net) if compiled else net, torch.optim.SGD(net.parameters(), lr=0.1)
            )
            losses = []
            for step in range(STEPS):
                x, y = fabric.to_device(batch(0, step))
                loss = nn.functional.mse_loss(model(x), y)
                fabric.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.item())
            runs[compiled] = losses
            calls[compiled] = (is_compiled(model._call), type(model._strategy_module).__name__)
        result[strategy] = {
            "eager_call_compiled": calls[False][0],
            "compiled_call_compiled": calls[True][0],
            "forward_module": calls[True][1],
            "max_difference": max(abs(a - b) for a, b in zip(runs[True], runs[False])),
            "keys": sorted(model.state_dict()),
        }
    return result


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def fsdp_on_gpu() -> dict:
    """FSDPStrategy on one GPU over NCCL (world size 1) in 32-true and bf16-mixed: parameters sharded on the device,
    the loss going down, a sharded checkpoint loaded into a fresh model with equal parameters."""
    from fabric_lite.strategies import FSDPStrategy

    result: dict = {}
    folder = tempfile.mkdtemp()
    fabric = None
    for precision in ("32-true", "bf16-mixed"):
        strategy = FSDPStrategy(auto_wrap_policy={nn.Linear})
        fabric = Fabric(accelerator="cuda", devices=1, strategy=strategy, precision=precision)
        fabric.launch()

        def build() -> tuple:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
            model = fabric.setup_module(model)
            return model, fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))

        model, optimizer = build()
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)
        x, y = fabric.to_device((x, y))
        losses = []
        for _ in range(20):
            loss = nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        path = os.path.join(folder, precision)
        fabric.save(path, {"model": model, "optimizer": optimizer, "step": 20})
        fresh, fresh_optimizer = build()
        state = {"model": fresh, "optimizer": fresh_optimizer}
        remainder = fabric.load(path, state)
        with torch.no_grad():
            same = all(torch.equal(_full(a), _full(b)) for a, b in zip(model.parameters(), fresh.parameters()))
            inner = model(x).dtype
        result[precision] = {
            "param_devices": sorted({str(p.device) for p in model.parameters()}),
            "loss_went_down": losses[-1] < losses[0] and all(v == v for v in losses),
            "is_folder": os.path.isdir(path),
            "same_after_load": same,
            "remainder": remainder,
            "output": str(inner),
        }
    return result


def model_parallel_on_gpu() -> dict:
    """ModelParallelStrategy on one GPU over NCCL: the example's Llama created on the meta device, tensor parallel
    and FSDP2 applied on the (1-rank) mesh dimensions so that every parameter is a DTensor on the GPU, loss_parallel,
    bf16-mixed through the strategy's MixedPrecisionPolicy, clip_gradients over DTensor gradients, and a sharded
    checkpoint loaded into a fresh model with equal parameters and the same next loss."""
    import importlib.util

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from fabric_lite.strategies import ModelParallelStrategy
    from fabric_lite.strategies.parallelize import TransformerPlan, apply_fsdp, apply_tensor_parallel

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "tensor_parallel.py")
    spec = importlib.util.spec_from_file_location("tensor_parallel_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    holder: dict = {}

    def parallelize(model: nn.Module, mesh: object) -> nn.Module:
        plan = TransformerPlan()
        apply_tensor_parallel(model, mesh["tensor_parallel"], plan, loss_parallel=True)  # type: ignore[index]
        policy = holder["strategy"].mixed_precision_policy
        apply_fsdp(model, mesh["data_parallel"], plan, mp_policy=policy)  # type: ignore[index]
        return model

    strategy = ModelParallelStrategy(parallelize, data_parallel_size=1, tensor_parallel_size=1)
    holder["strategy"] = strategy
    fabric = Fabric(accelerator="cuda", devices=1, strategy=strategy, precision="bf16-mixed")
    fabric.launch()
    vocab, context = 32, 16

    def build() -> tuple:
        torch.manual_seed(0)
        with fabric.init_module(empty_init=True):
            model = example.Llama(vocab, dim=64, heads=4, hidden=128, layers=2)
        model = fabric.setup_module(model)
        return model, fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False))

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
        optimizer.zero_grad()
        with loss_parallel():
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            fabric.backward(loss)
        norm = fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        holder["norm"] = float(norm)
        return (loss.full_tensor() if isinstance(loss, DTensor) else loss).item()

    model, optimizer = build()
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, vocab, (8, context + 1), generator=g).to(fabric.device) for _ in range(12)]
    losses = [step(model, optimizer, b) for b in batches[:10]]
    folder = os.path.join(tempfile.mkdtemp(), "step-10")
    fabric.save(folder, {"model": model, "optimizer": optimizer, "step": 10})
    fresh, fresh_optimizer = build()
    remainder = fabric.load(folder, {"model": fresh, "optimizer": fresh_optimizer})
    with torch.no_grad():
        same = all(torch.equal(_full(a), _full(b)) for a, b in zip(model.parameters(), fresh.parameters()))
    next_original = step(model, optimizer, batches[10])
    next_resumed = step(fresh, fresh_optimizer, batches[10])
    return {
        "mesh": list(strategy.device_mesh.shape),
        "dtensors": all(isinstance(p, DTensor) for p in model.parameters()),
        "devices": sorted({str(_full(p).device) for p in model.parameters()}),
        "loss_went_down": losses[-1] < losses[0],
        "finite_norm": holder["norm"] == holder["norm"] and holder["norm"] > 0,
        "is_folder": os.path.isdir(folder),
        "same_after_load": same,
        "remainder": remainder,
        "same_next_loss": next_original == next_resumed,
    }


def pipeline_stages_on_gpu() -> dict:
    """Two pipeline stages on one GPU (NCCL refuses two ranks there): the test model split by split_transformer,
    both stages on this rank under Interleaved1F1B over NCCL at world size 1; one step's gradients against the
    unsplit model's over the whole batch, in float32 and under bf16 autocast, and the peak device memory of a step
    for 1, 2, 4 and 8 micro-batches."""
    import torch.distributed as dist

    from fabric_lite.strategies._pipeline import Pipeline
    from fabric_lite.strategies.parallelize import split_transformer
    from tests.helpers.jobs.model_parallel_jobs import Llama, loss_of

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    batch = torch.randint(0, 32, (16, 65), generator=torch.Generator().manual_seed(0)).to(device)
    result: dict = {"peak_mb": {}}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model, twin = Llama(depth=4).to(device), Llama(depth=4).to(device)
        twin.load_state_dict(model.state_dict())
        pipeline = Pipeline(
            split_transformer(model, [0, 1], 2), [0, 1], 2, dist.group.WORLD, device, "Interleaved1F1B", 4
        )
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = pipeline.step((batch[:, :-1],), {}, batch, loss_of)
            expected = loss_of(twin(batch[:, :-1]), batch)
        expected.backward()
        grads = dict(pipeline.module.named_parameters())
        result[str(dtype)] = {
            "loss": [loss.item(), expected.item()],
            "grad_error": max((grads[n].grad - p.grad).abs().max().item() for n, p in twin.named_parameters()),
            "devices": sorted({str(p.device) for p in pipeline.module.parameters()}),
        }
    for microbatches in (1, 2, 4, 8):
        torch.manual_seed(0)
        model = Llama(depth=4).to(device)
        pipeline = Pipeline(
            split_transformer(model, [0, 1], 2), [0, 1], 2, dist.group.WORLD, device, "Interleaved1F1B", microbatches
        )
        pipeline.step((batch[:, :-1],), {}, batch, loss_of)  # the first step sizes the stages' buffers
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        pipeline.step((batch[:, :-1],), {}, batch, loss_of)
        torch.cuda.synchronize()
        result["peak_mb"][microbatches] = round((torch.cuda.max_memory_allocated() - before) / 2**20, 3)
    dist.destroy_process_group()
    return result


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
        compiled_on_gpu,
        fsdp_on_gpu,
        model_parallel_on_gpu,
        pipeline_stages_on_gpu,
    )
}

if __name__ == "__main__":
    # inductor's cache stays where it would be: its compile workers may still write there after the scratch is gone
    default_cache = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache)
    with tempfile.TemporaryDirectory() as scratch:  # checkpoints written by the checks go here, and go with it
        tempfile.tempdir = scratch
        emit(CHECKS[sys.argv[1]]())
