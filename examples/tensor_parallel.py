"""A small Llama-style language model trained with tensor parallelism and FSDP2 together, on four CPU processes, and
with pipeline parallelism as a third dimension.

    python examples/tensor_parallel.py                            # 4 processes (2 tensor-parallel x 2 FSDP), 40 steps
    python examples/tensor_parallel.py --steps 12 --save-every 6  # a short run
    python examples/tensor_parallel.py --resume --steps 60        # continue from the newest checkpoint to step 60
    torchrun --nproc-per-node 4 examples/tensor_parallel.py --resume
    fabric-lite run --devices 4 examples/tensor_parallel.py --resume
    python examples/tensor_parallel.py --pipeline-parallel-size 2  # 8 processes: 2 stages x 2 FSDP x 2 tensor-parallel
    python examples/tensor_parallel.py --pipeline-parallel-size 2 --layers 4 --pipeline-schedule Interleaved1F1B

``ModelParallelStrategy`` arranges the four processes in a 2 x 2 mesh, ``("data_parallel", "tensor_parallel")``.
Within a tensor-parallel pair every projection is split between the two processes (attention ``wq``/``wk``/``wv``
and MLP ``w1``/``w3`` by output columns, ``wo`` and ``w2`` by input rows, the embedding and the head over the
vocabulary), and the activations between them (norms, residuals) are split along the sequence. Across the
data-parallel pair FSDP2 shards what each process holds once more, block by block. ``parallelize_transformer``
applies both from the module names (``layers[i].attention.wq``, ``layers[i].feed_forward.w1``, ...); the model is
created on the meta device and each process allocates and initialises only its own shards of the weights.

The head's output stays split over the vocabulary (``loss_parallel=True``): the cross-entropy and its backward
run inside ``torch.distributed.tensor.parallel.loss_parallel()``, so the full logits are never gathered.

With ``--pipeline-parallel-size 2`` the mesh gets a ``"pipeline_parallel"`` dimension first: ``split_transformer``
gives the first stage the embedding and the first half of the blocks, the second the rest, the norm and the head,
and each stage is then parallelised as above over its own 2 x 2 ranks. The step is the same line either way,
``fabric.pipeline_step(model, inputs, target=..., loss_fn=...)``: without a pipeline it is the forward, the loss and
``fabric.backward``; with one, the schedule (``--pipeline-schedule``) runs the forwards and backwards of
``--microbatches`` micro-batches. The head's output is then gathered (``loss_parallel`` is for one stage).

The text is generated in code (sentences from a tiny grammar, no download) and read as characters. The model has
rotary position embeddings, RMSNorm, causal attention (``scaled_dot_product_attention(..., is_causal=True)``) and
a SwiGLU MLP. The two processes of a tensor-parallel pair see the same batches, the two pairs different ones.

Every ``--save-every`` steps (and at the last step) ``fabric.save`` writes a ``torch.distributed.checkpoint``
folder ``step-NNNNNN`` (each process its shards of the model and of the AdamW state, plus the step);
``--resume`` loads the newest one in ``--checkpoint-dir`` (or the folder given) and continues from its step,
entering the data where the run left it: the resumed run prints the same losses as one that never stopped. The
loss is printed every ``--log-every`` steps, averaged over the data-parallel group.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import re
from collections.abc import Iterator
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from fabric_lite import Fabric
from fabric_lite.strategies import ModelParallelStrategy
from fabric_lite.strategies.parallelize import parallelize_transformer

SUBJECTS = ["the cat", "a dog", "the old king", "my friend", "the robot", "a small bird", "the farmer"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "carries", "remembers"]
OBJECTS = ["the moon", "a red apple", "the river", "its shadow", "the garden", "a song", "the door"]


def make_text(sentences: int = 800, seed: int = 0) -> str:
    """Sentences from a tiny grammar: the same text on every process and in every run."""
    rng = random.Random(seed)
    lines = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(sentences)]
    return "\n".join(lines) + "\n"


class Windows(Dataset[Tensor]):
    """The text cut into windows of ``context + 1`` characters: the input and, shifted by one, the targets."""

    def __init__(self, data: Tensor, context: int) -> None:
        self.windows = data[: len(data) // (context + 1) * (context + 1)].view(-1, context + 1)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> Tensor:
        return self.windows[index]


# ---------------------------------------------------------------------------------------------- the model
def rotary_frequencies(length: int, head_dim: int, device: torch.device) -> Tensor:
    """``(length, head_dim / 2)`` complex rotations, one angle per position and pair of channels (RoPE)."""
    inverse = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(length, device=device).float(), inverse)
    return torch.polar(torch.ones_like(angles), angles)


def rotate(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """Rotate each pair of channels of ``x`` (batch, length, heads, head_dim) by its position's angle."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis[:, None, :]).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, freqs_cis: Tensor) -> Tensor:
        batch, length, _ = x.shape
        # -1 heads, not `heads`: under tensor parallelism wq/wk/wv give each process heads / tp of them
        q, k, v = (w(x).view(batch, length, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, freqs_cis[:length]), rotate(k, freqs_cis[:length])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, length, head_dim)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # each position sees only the past
        return self.wo(attended.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then the MLP, each with a residual."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: Tensor, freqs_cis: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Module names as ``TransformerPlan``'s defaults, so ``parallelize_transformer`` needs no plan."""

    def __init__(
        self, vocab_size: int, dim: int = 64, heads: int = 4, hidden: int = 128, layers: int = 2, context: int = 64
    ) -> None:
        super().__init__()
        self.head_dim, self.context = dim // heads, context
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList([Block(dim, heads, hidden) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        # computed here rather than kept as a buffer: a buffer made on the meta device would need initialising too;
        # for the longest input, not this one's: a later pipeline stage gets activations, split along the sequence
        freqs_cis = rotary_frequencies(self.context, self.head_dim, tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h))  # (batch, length, vocab) logits; with loss_parallel a vocab-split DTensor


# ---------------------------------------------------------------------------------------------- training
def find_checkpoint(resume: str, folder: Path) -> Path | None:
    """The folder ``--resume`` names, or with ``--resume`` alone the newest ``step-NNNNNN`` folder in ``folder``."""
    if resume != "last":
        path = Path(resume)
        if not path.is_dir():
            raise FileNotFoundError(f"--resume {resume}: no such checkpoint folder. Omit the path to take the newest.")
        return path
    found = sorted(p for p in folder.glob("step-*") if p.is_dir() and re.fullmatch(r"step-\d{6}", p.name))
    return found[-1] if found else None


def batches_after(loader: DataLoader[Tensor], step: int) -> Iterator[Tensor]:
    """The batches of steps ``step + 1``, ``step + 2``, ...: the loader's epochs one after another, entered where
    a run that started at step 0 would be after ``step`` steps."""
    epoch, skip = divmod(step, len(loader))
    loader.load_state_dict({"epoch": epoch})  # the sampler shuffles as that epoch did
    while True:
        yield from itertools.islice(loader, skip, None)
        skip = 0


def train(fabric: Fabric, args: argparse.Namespace) -> None:
    text = make_text()
    alphabet = sorted(set(text))
    # the embedding and the head are split over the vocabulary: pad it to a multiple of 8 so that it divides evenly
    vocab_size = math.ceil(len(alphabet) / 8) * 8
    data = torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)

    fabric.seed_everything(1337, verbose=False)  # the same initial weights whatever the mesh
    with fabric.init_module(empty_init=True):  # on the meta device: no memory, no initialisation yet
        model = Llama(vocab_size, args.dim, args.heads, 2 * args.dim, args.layers, context=args.context)
    model = fabric.setup_module(model)  # parallelised, then each process's shards allocated and initialised
    # after setup_module: parallelising replaces the parameters by DTensors, which the optimizer must hold
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False))
    # batch_size per data-parallel rank; the sampler gives both processes of a tensor-parallel pair the same ones
    loader = fabric.setup_dataloaders(
        DataLoader(Windows(data, args.context), batch_size=args.batch_size, shuffle=True, drop_last=True)
    )
    state = {"model": model, "optimizer": optimizer, "step": 0}

    folder = Path(args.checkpoint_dir)
    if args.resume is not None:
        path = find_checkpoint(args.resume, folder)
        if path is None:
            fabric.print(f"no checkpoint in {folder} yet: starting from step 0")
        else:
            fabric.load(path, state)  # every process reads its own shards; "step" is written back
            fabric.print(f"resumed from {path} at step {state['step']}")
    start = int(state["step"])

    mesh = fabric.strategy.device_mesh
    data_parallel = mesh["data_parallel"].get_group()
    first = next(iter(model.module.layers))  # this process's first block (with a pipeline, of its stage)
    weight = first.attention.wq.weight
    local = weight.to_local() if isinstance(weight, DTensor) else weight  # a 1 x 1 mesh parallelises nothing
    sizes = " x ".join(f"{size} {name}" for name, size in zip(mesh.mesh_dim_names, mesh.shape, strict=True))
    fabric.print(
        f"{sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters on a mesh of {sizes};"
        f" its first block's attention.wq.weight is {tuple(weight.shape)}, each process holds {tuple(local.shape)}"
    )
    fabric.print(f"training steps {start + 1}..{args.steps} on {fabric.world_size} processes")

    def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    batches = batches_after(loader, start)
    for step in range(start + 1, args.steps + 1):
        batch = next(batches)
        optimizer.zero_grad()
        # forward, loss and backward (with a pipeline, over its micro-batches); with the logits split over the
        # vocabulary, the loss and its backward both need the loss_parallel context
        with loss_parallel() if args.pipeline_parallel_size == 1 else nullcontext():
            loss = fabric.pipeline_step(model, batch[:, :-1], target=batch[:, 1:], loss_fn=cross_entropy)
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        state["step"] = step

        if step % args.log_every == 0 or step == args.steps:
            # a DTensor replicated over the tensor-parallel pair: its full value is the pair's loss
            loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
            # every process must call it; the mean over the data-parallel pair is the whole batch's loss
            mean_loss = fabric.all_reduce(loss.detach(), group=data_parallel, reduce_op="mean")
            fabric.print(f"step {step:5d}  loss {mean_loss.item():.4f}")
        if step % args.save_every == 0 or step == args.steps:
            path = folder / f"step-{step:06d}"
            fabric.save(path, state)  # every process writes its shards; the folder appears whole or not at all
            fabric.print(f"saved {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument(
        "--devices", default=None, help="processes (CPU) or GPUs; default data x tensor parallel size, or torchrun's"
    )
    parser.add_argument("--data-parallel-size", type=int, default=2, help="FSDP2 ranks")
    parser.add_argument("--tensor-parallel-size", type=int, default=2, help="ranks each layer is split over")
    parser.add_argument("--pipeline-parallel-size", type=int, default=1, help="pipeline stages (ranks in a pipeline)")
    parser.add_argument("--pipeline-schedule", default="1F1B", help="GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, ...")
    parser.add_argument("--microbatches", type=int, default=None, help="per batch; default: one per stage")
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per data-parallel rank and step")
    parser.add_argument("--context", type=int, default=64, help="characters the model sees")
    parser.add_argument("--dim", type=int, default=64, help="model width (the MLP is twice as wide)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads; a multiple of the tensor parallel size")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--log-every", type=int, default=10, help="steps between printed losses")
    parser.add_argument("--checkpoint-dir", default=os.path.join("checkpoints", "tensor_parallel"))
    parser.add_argument(
        "--resume",
        nargs="?",
        const="last",
        default=None,
        metavar="CHECKPOINT",
        help="continue from the CHECKPOINT folder, or without a value from the newest one in --checkpoint-dir",
    )
    args = parser.parse_args()
    for name in ("steps", "save_every", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give a positive number of steps")
    if args.heads % args.tensor_parallel_size or args.dim % args.heads:
        parser.error(
            f"--heads {args.heads} must divide --dim {args.dim} and be a multiple of --tensor-parallel-size"
            f" {args.tensor_parallel_size} (each process holds heads / tensor-parallel-size heads)"
        )
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # torchrun or fabric-lite run started the processes
    sizes = (args.data_parallel_size, args.tensor_parallel_size, args.pipeline_parallel_size)
    default_devices = "auto" if launched else math.prod(sizes)
    strategy = ModelParallelStrategy(
        partial(parallelize_transformer, loss_parallel=args.pipeline_parallel_size == 1),
        data_parallel_size=args.data_parallel_size,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        pipeline_schedule=args.pipeline_schedule,
        pipeline_microbatches=args.microbatches,
    )
    fabric = Fabric(accelerator=args.accelerator, devices=args.devices or default_devices, strategy=strategy)
    fabric.launch()
    train(fabric, args)


if __name__ == "__main__":
    main()
