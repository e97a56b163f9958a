"""Step time and peak memory per rank of ``ModelParallelStrategy`` against the same model parallelised by hand with
raw torch: four ranks on the CPU (gloo), 2-way tensor parallel x 2-way FSDP, or with ``--pipeline`` 2 pipeline stages
x 2-way FSDP.

    python benchmarks/bench_model_parallel.py            # 4.46M parameters, 15 rounds (about 5 minutes on 2 cores)
    python benchmarks/bench_model_parallel.py --quick    # smoke run: a tiny model, few steps, one round (the tests)
    python benchmarks/bench_model_parallel.py --pipeline # pipelined: 1F1B over 4 micro-batches of the batch

The workload, the same for both: a Llama-style transformer (RMSNorm, attention with causal masking, SwiGLU MLP;
depth 4, width 256, 8 heads, MLP 768, vocabulary 2048: the test model of ``tests/helpers/jobs/model_parallel_jobs.py``,
larger), parallelised by ``functools.partial(parallelize_transformer, loss_parallel=True)`` on a mesh
``("data_parallel", "tensor_parallel")`` of shape (2, 2), trained with AdamW on a fixed batch per data-parallel rank.
The loop is the one its user would write:

* ``raw``: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))``; the model
  created on the meta device, parallelised, ``to_empty(device="cpu")``, each module's ``reset_parameters()`` (the
  way torchtitan initialises); per step ``zero_grad``, forward, the loss and ``backward`` under ``loss_parallel()``,
  the gradient norm clipped as torchtitan does (``get_total_norm``, ``full_tensor``, ``clip_grads_with_norm_``),
  ``step``.
* ``fabric_lite``: ``Fabric(devices=4, strategy=ModelParallelStrategy(parallelize, data_parallel_size=2,
  tensor_parallel_size=2))``; the model created under ``fabric.init_module(empty_init=True)``, ``setup_module``,
  ``setup_optimizers``; per step the same with ``fabric.backward(loss)`` and ``fabric.clip_gradients(model,
  optimizer, max_norm=...)``.

With ``--pipeline`` the mesh is ``("pipeline_parallel", "data_parallel", "tensor_parallel")`` of shape (2, 2, 1) and
each data-parallel rank's batch is 4 sequences, split into 4 micro-batches under ``Schedule1F1B``:

* ``raw``: pipelined by hand as torchtitan does: the meta-device model cut into this rank's stage (its half of the
  blocks, the embedding on the first stage, the norm and head on the last, an ``nn.Identity`` where a part is
  elsewhere), FSDP2 over the data-parallel ranks, allocated and initialised; a ``PipelineStage`` and a
  ``Schedule1F1B`` over the pipeline dimension's group; per step the schedule's ``step`` (the input on the first
  stage, the target on the last), the gradient norm combined over the stages with one all-reduce, ``step``.
* ``fabric_lite``: ``ModelParallelStrategy(parallelize, data_parallel_size=2, tensor_parallel_size=1,
  pipeline_parallel_size=2, pipeline_schedule="1F1B", pipeline_microbatches=4)``; per step
  ``fabric.pipeline_step(model, inputs, target=batch, loss_fn=...)`` (which also gives every rank the loss),
  ``fabric.clip_gradients`` and ``step``.

On 2 cores a step takes far longer than its arithmetic: four ranks share the cores, and DTensor's Python dispatch
costs about 130 ms of CPU a rank a step even for the test model, besides some 65 gloo collectives.

Two measurements, each in processes started by ``torch.distributed.run``:

* ``step``: both implementations in the same four processes, on the same initial weights (the raw model loads the
  fabric_lite model's state dict), taking turns in paired rounds (the order alternating), with a barrier before
  every timed block of steps, so that machine noise hits both alike. Per rank: the median over rounds of each
  implementation's mean step time, and the median and interquartile range (``spread``) of the per-round ratios.
* ``rss_peak``: each implementation alone in fresh processes, the two alternating round after round (memory cannot
  be told apart inside one process): the resident set's high-water mark at the end of the run (``VmHWM``) minus the
  resident set just before the model is built, as ``bench_fsdp.py`` measures it (imports, the process group and the
  mesh are not counted). The mark is reset just before (``/proc/self/clear_refs``), after two steps of a tiny model
  through the same implementation, released again: the first call of each kernel and code path pages in code and
  sets up library state, which is not the model's memory. The figure counts everything else the process touched:
  the shards of the parameters, gradients and optimizer state, activations, communication buffers and transient
  copies (fabric_lite initialises one module's full-size tensors at a time, to give every mesh the values of an
  eager construction). ``MALLOC_MMAP_THRESHOLD_`` is fixed, as in ``bench_memory.py``, so that glibc returns large
  blocks to the system when they are freed.

Prints one table (medians, rank by rank, and the fabric_lite/raw ratios); ``--out`` also writes it as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import child_env, format_value, leave_process_group, quartiles, result_rows
from torch import nn

IMPLS = ("raw", "fabric_lite")
TP, DP = 2, 2
WORLD = TP * DP
MESH_DIMS = ("data_parallel", "tensor_parallel")
#: the pipelined layout (``--pipeline``): stages, micro-batches per batch, and the sequences of a data-parallel batch
PP, MICROBATCHES, PP_BATCH = 2, 4, 4
PP_MESH_DIMS = ("pipeline_parallel", "data_parallel", "tensor_parallel")
#: the model, and the batch of each data-parallel rank (``seq`` tokens and the next-token targets)
MODELS = {
    "full": {"vocab": 2048, "dim": 256, "heads": 8, "hidden": 768, "depth": 4, "seq": 32, "batch": 2},
    "quick": {"vocab": 64, "dim": 32, "heads": 4, "hidden": 64, "depth": 2, "seq": 16, "batch": 2},
}
#: (rounds, steps per round) of the paired step timing; (rounds, timed steps) of the memory runs
SCHEDULES = {
    "full": {"rounds": 15, "steps": 6, "memory_rounds": 3, "memory_steps": 6},
    "quick": {"rounds": 3, "steps": 2, "memory_rounds": 1, "memory_steps": 2},
}
WARMUP = 2
#: a fixed glibc mmap threshold for the memory runs: large blocks go back to the system when freed (with the default,
#: adaptive threshold the figure of identical runs swung by +-6 MB a rank; with this one by +-0.5 MB)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
LR = 1e-3
MAX_NORM = 1.0


# ---------------------------------------------------------------------------------------------- the model
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """The module names are those ``TransformerPlan()`` expects by default."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask)
        return self.output(self.norm(h))


def new_model(config: dict[str, int]) -> Llama:
    return Llama(config["vocab"], config["dim"], config["heads"], config["hidden"], config["depth"])


def parallelize_fn(pipeline: bool = False) -> Any:
    from fabric_lite.strategies.parallelize import parallelize_transformer

    return partial(parallelize_transformer, loss_parallel=not pipeline)


def batch_for(config: dict[str, int], dp_rank: int, pipeline: bool = False) -> torch.Tensor:
    """This data-parallel rank's fixed batch of ``seq + 1`` tokens (input and next-token target); the ranks of a
    tensor-parallel group (and of a pipeline) get the same one."""
    generator = torch.Generator().manual_seed(1000 + dp_rank)
    batch = PP_BATCH if pipeline else config["batch"]
    return torch.randint(0, config["vocab"], (batch, config["seq"] + 1), generator=generator)


def loss_of(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


# ---------------------------------------------------------------------------------------------- implementations
def setup_raw(config: dict[str, int], mesh: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The hand-written setup: meta-device model, parallelised, allocated, initialised module by module."""
    with torch.device("meta"):
        model = new_model(config)
    model = parallelize_fn()(model, mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def raw_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    optimizer.zero_grad()
    with loss_parallel():
        loss = loss_of(model(batch[:, :-1]), batch)
        loss.backward()
    # torchtitan's clipping: the norm of DTensor gradients is a partial DTensor; make it whole, then scale
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), MAX_NORM, norm)
    optimizer.step()
    return loss


class RawPipeline:
    """The model pipelined by hand: this rank's stage, FSDP2 over the data-parallel ranks, 1F1B over the pipeline."""

    def __init__(self, config: dict[str, int], mesh: Any) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pp = mesh["pipeline_parallel"]
        self.stage, self.pp_group = pp.get_local_rank(), pp.get_group()
        self.first, self.last = self.stage == 0, self.stage == PP - 1
        with torch.device("meta"):
            model = new_model(config)
        per_stage = config["depth"] // PP
        self.offset = self.stage * per_stage  # the blocks keep their order; their index is shifted by this
        model.layers = nn.ModuleList(list(model.layers)[self.offset : self.offset + per_stage])
        if not self.first:
            model.tok_embeddings = nn.Identity()  # type: ignore[assignment]
        if not self.last:
            model.norm, model.output = nn.Identity(), nn.Identity()  # type: ignore[assignment]
        model = parallelize_fn(pipeline=True)(model, mesh)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for module in model.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        self.model, self.optimizer = model, torch.optim.AdamW(model.parameters(), lr=LR)
        stage = PipelineStage(model, self.stage, PP, torch.device("cpu"), group=self.pp_group)
        self.schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_of)

    def load_from(self, state: dict[str, Any]) -> None:
        """The weights of fabric_lite's stage, whose blocks have the whole model's indices."""

        def renamed(key: str) -> str:
            if not key.startswith("layers."):
                return key
            _, index, rest = key.split(".", 2)
            return f"layers.{int(index) - self.offset}.{rest}"

        self.model.load_state_dict({renamed(k): v for k, v in state.items()})

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        self.optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if self.first:
            self.schedule.step(batch[:, :-1], return_outputs=False)
        else:
            self.schedule.step(target=batch, losses=losses, return_outputs=False)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squared = norm**2
        torch.distributed.all_reduce(squared, group=self.pp_group)  # the stages hold different layers
        torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), MAX_NORM, squared.sqrt())
        self.optimizer.step()
        return torch.stack(losses).mean() if losses else torch.tensor(float("nan"))


def make_fabric(pipeline: bool = False) -> Any:
    from fabric_lite import Fabric
    from fabric_lite.strategies import ModelParallelStrategy

    if pipeline:
        strategy = ModelParallelStrategy(
            parallelize_fn(pipeline=True),
            data_parallel_size=DP,
            tensor_parallel_size=1,
            pipeline_parallel_size=PP,
            pipeline_schedule="1F1B",
            pipeline_microbatches=MICROBATCHES,
        )
    else:
        strategy = ModelParallelStrategy(parallelize_fn(), data_parallel_size=DP, tensor_parallel_size=TP)
    return Fabric(accelerator="cpu", devices=WORLD, strategy=strategy)


def fabric_pipeline_step(fabric: Any, model: Any, optimizer: Any, batch: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = fabric.pipeline_step(model, batch[:, :-1], target=batch, loss_fn=loss_of)
    fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM)
    optimizer.step()
    return loss  # type: ignore[no-any-return]


def setup_fabric(fabric: Any, config: dict[str, int]) -> tuple[Any, Any]:
    with fabric.init_module(empty_init=True):
        model = new_model(config)
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=LR))
    return model, optimizer


def fabric_step(fabric: Any, model: Any, optimizer: Any, batch: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor.parallel import loss_parallel

    optimizer.zero_grad()
    with loss_parallel():
        loss = loss_of(model(batch[:, :-1]), batch)
        fabric.backward(loss)
    fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM)
    optimizer.step()
    return loss


def _scalar(loss: torch.Tensor) -> float:
    return float(loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item())


# ---------------------------------------------------------------------------------------------- children
def emit(payload: dict[str, Any]) -> None:
    # one write() of less than PIPE_BUF bytes: the ranks share the pipe, and such a write is never interleaved
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(payload) + "\n").encode())


def _proc_status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {key}: the memory figure needs Linux")


def time_child(size: str, pipeline: bool) -> None:
    """Under torchrun, 4 ranks: both implementations in these processes, in paired rounds; prints this rank's
    per-round step times."""
    import torch.distributed as dist
    from bench_core import timed_rounds
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    config = {**MODELS[size], **SCHEDULES[size]}
    fabric = make_fabric(pipeline)
    fabric.launch()
    torch.manual_seed(0)
    model, optimizer = setup_fabric(fabric, config)
    # the same start: both train the same model to the same loss
    if pipeline:
        mesh = init_device_mesh("cpu", (PP, DP, 1), mesh_dim_names=PP_MESH_DIMS)
        raw = RawPipeline(config, mesh)
        raw.load_from(model.state_dict())
        batch = batch_for(config, mesh["data_parallel"].get_local_rank(), pipeline)
        steps = {
            "raw": partial(raw.step, batch),
            "fabric_lite": partial(fabric_pipeline_step, fabric, model, optimizer, batch),
        }
    else:
        mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=MESH_DIMS)
        raw_model, raw_optimizer = setup_raw(config, mesh)
        raw_model.load_state_dict(model.state_dict())
        batch = batch_for(config, mesh["data_parallel"].get_local_rank())
        steps = {
            "raw": partial(raw_step, raw_model, raw_optimizer, batch),
            "fabric_lite": partial(fabric_step, fabric, model, optimizer, batch),
        }
    times = timed_rounds(steps, config["rounds"], config["steps"], sync=dist.barrier)
    losses = {name: _scalar(step()) for name, step in steps.items()}  # after the same number of steps each
    emit({"rank": dist.get_rank(), "times": times, "loss": losses})
    leave_process_group()  # FSDP2 has no reducer: its models may outlive the group


def memory_child(impl: str, size: str, pipeline: bool) -> None:
    """Under torchrun, 4 ranks: ``impl`` alone in fresh processes; prints this rank's peak RSS growth."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    config = {**MODELS[size], **SCHEDULES[size]}
    if impl == "fabric_lite":
        fabric = make_fabric(pipeline)
        fabric.launch()
        mesh = fabric.strategy.device_mesh
    else:
        dist.init_process_group("gloo")
        shape, names = ((PP, DP, 1), PP_MESH_DIMS) if pipeline else ((DP, TP), MESH_DIMS)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    dp_rank = mesh["data_parallel"].get_local_rank()

    def build(config: dict[str, int]) -> Any:
        batch = batch_for(config, dp_rank, pipeline)
        if impl == "fabric_lite":
            model, optimizer = setup_fabric(fabric, config)
            step = fabric_pipeline_step if pipeline else fabric_step
            return model, partial(step, fabric, model, optimizer, batch)
        if pipeline:
            raw = RawPipeline(config, mesh)
            return raw.model, partial(raw.step, batch)
        model, optimizer = setup_raw(config, mesh)
        return model, partial(raw_step, model, optimizer, batch)

    # Two steps of the tiny model first, released before the figure starts: the first call of every kernel and
    # code path (DTensor's, FSDP2's, the implementation's lazy imports) pages in code and sets up library state,
    # which is not the model's memory.
    warm_up = build(MODELS["quick"])[1]
    for _ in range(2):
        warm_up()
    del warm_up
    gc.collect()
    dist.barrier()
    torch.manual_seed(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets the high-water mark (VmHWM) to the current RSS
    rss_before = _proc_status("VmRSS")
    model, step = build(config)
    times = []
    for index in range(WARMUP + config["memory_steps"]):
        dist.barrier()
        start = time.perf_counter()
        loss = step()
        dist.barrier()
        if index >= WARMUP:
            times.append(time.perf_counter() - start)
    peak_rss = _proc_status("VmHWM")
    shards = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    emit(
        {
            "impl": impl,
            "rank": dist.get_rank(),
            "rss_peak": peak_rss - rss_before,
            "step": statistics.median(times),
            "loss": _scalar(loss),
            "local_params": sum(shard.numel() for shard in shards),
        }
    )
    leave_process_group()  # FSDP2 has no reducer: its models may outlive the group


# ---------------------------------------------------------------------------------------------- the parent
def launch(args: list[str], extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run this script with ``args`` on 4 ranks under torchrun; every rank's ``RESULT`` row, by rank."""
    env = {**child_env(), **(extra_env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    rows = result_rows([*command, __file__, *args], " ".join(args), 1200, env=env, need=WORLD)
    return sorted(rows, key=lambda row: row["rank"])


def measure_memory(size: str, rounds: int, layout: list[str]) -> dict[str, list[list[dict[str, Any]]]]:
    """``rounds`` rounds in which each implementation runs once in fresh processes, alternating the order."""
    runs: dict[str, list[list[dict[str, Any]]]] = {impl: [] for impl in IMPLS}
    for r in range(rounds):
        for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
            runs[impl].append(launch(["--child", "memory", "--impl", impl, "--size", size, *layout], MALLOC_ENV))
    return runs


def table(timed: list[dict[str, Any]], memory: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per figure and rank: each implementation's median, the ratio and its spread; prints them and returns them.

    Step time: medians over the paired rounds, the ratio the median of the per-round ratios. Peak RSS: medians over
    the rounds of fresh processes, the ratio that of the medians (the rounds are not paired), spread the
    interquartile range of the per-round ratios."""
    rows = []
    for row in timed:
        raw, mine = row["times"]["raw"], row["times"]["fabric_lite"]
        low, ratio, high = quartiles([m / r for m, r in zip(mine, raw, strict=True)])
        medians = {"raw": statistics.median(raw), "fabric_lite": statistics.median(mine)}
        rows.append({"figure": "step", "unit": "s", "rank": row["rank"], "medians": medians, "ratio": ratio})
        rows[-1]["spread"] = high - low
    for rank in range(WORLD):
        values = {impl: [run[rank]["rss_peak"] for run in memory[impl]] for impl in IMPLS}
        medians = {impl: statistics.median(v) for impl, v in values.items()}
        low, _, high = quartiles([m / r for m, r in zip(values["fabric_lite"], values["raw"], strict=True)])
        ratio = medians["fabric_lite"] / medians["raw"]
        rows.append({"figure": "rss_peak", "unit": "bytes", "rank": rank, "medians": medians, "ratio": ratio})
        rows[-1]["spread"] = high - low
    print(f"{'figure':<12}{'rank':>5}{'raw':>14}{'fabric_lite':>14}{'fabric_lite/raw':>17}{'spread':>9}")
    for row in rows:
        m, unit = row["medians"], row["unit"]
        print(
            f"{row['figure']:<12}{row['rank']:>5}{format_value(m['raw'], unit):>14}"
            f"{format_value(m['fabric_lite'], unit):>14}{row['ratio']:>16.3f}x{row['spread']:>9.3f}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model, few steps, one round")
    parser.add_argument(
        "--pipeline", action="store_true", help="2 pipeline stages x 2 FSDP (1F1B) instead of TP x FSDP"
    )
    parser.add_argument("--out", help="also write the table as JSON to this file")
    parser.add_argument("--child", choices=["time", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(MODELS), default="full", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "time":
        time_child(args.size, args.pipeline)
        return
    if args.child == "memory":
        memory_child(args.impl, args.size, args.pipeline)
        return
    size = "quick" if args.quick else "full"
    config = {**MODELS[size], **SCHEDULES[size]}
    params = sum(p.numel() for p in new_model(config).parameters())
    layout = (
        f"{PP} pipeline stages (1F1B, {MICROBATCHES} micro-batches)" if args.pipeline else f"{TP}-way tensor parallel"
    )
    print(
        f"CPU, {WORLD} ranks, gloo, {layout} x {DP}-way FSDP: a Llama-style model of depth"
        f" {config['depth']}, width {config['dim']}, {config['heads']} heads, MLP {config['hidden']}, vocabulary"
        f" {config['vocab']}: {params / 1e6:.2f}M parameters ({params * 4 / 1e6:.1f} MB in float32); AdamW, batch"
        f" {PP_BATCH if args.pipeline else config['batch']} x {config['seq']} tokens per data-parallel rank"
    )
    flags = ["--pipeline"] if args.pipeline else []
    timed = launch(["--child", "time", "--size", size, *flags])
    memory = measure_memory(size, config["memory_rounds"], flags)
    print(
        f"step: {config['rounds']} paired rounds of {config['steps']} steps in the same processes;"
        f" rss_peak: {config['memory_rounds']} round(s) of fresh processes, {WARMUP + config['memory_steps']} steps"
    )
    rows = table(timed, memory)
    losses = timed[-1]["loss"]  # the last rank: with a pipeline, the raw loop has the loss on the last stage only
    print(
        f"loss after the timed steps (same start, same batches): raw {losses['raw']:.6f},"
        f" fabric_lite {losses['fabric_lite']:.6f}"
    )
    if args.out:
        record = {
            "torch": torch.__version__,
            "size": config,
            "quick": args.quick,
            "pipeline": args.pipeline,
            "params": params,
            "table": rows,
            "time_runs": timed,
            "memory_runs": memory,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
