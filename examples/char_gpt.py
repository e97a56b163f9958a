"""A small GPT-style character model, trained on generated text, with checkpoints and exact resume.

    python examples/char_gpt.py                              # two CPU processes (DDP), 300 steps, about a minute
    python examples/char_gpt.py --steps 40 --save-every 20   # a short run
    python examples/char_gpt.py --resume --steps 600         # continue from the last checkpoint to step 600
    python examples/char_gpt.py --resume checkpoints/char_gpt/step-000100.ckpt   # from a chosen checkpoint
    torchrun --nproc-per-node 2 examples/char_gpt.py --resume
    fabric-lite run --devices 2 --max-restarts 2 examples/char_gpt.py --resume   # restarts resume by themselves

The text is generated in code (sentences from a tiny grammar, no download). The model is two transformer blocks
with causal self-attention (``scaled_dot_product_attention(..., is_causal=True)``), 64-dimensional, over a
64-character context. Each process draws its own random batches; DDP averages the gradients.

Every ``--save-every`` steps (and at the last step) ``fabric.save`` writes ``step-NNNNNN.ckpt`` with the model,
the optimizer, the step and every process's random generators (``RandomState``). ``--resume`` loads the newest
checkpoint in ``--checkpoint-dir`` (or the file given) and continues from its step: the resumed run prints the
same losses as one that never stopped. Resume with the same number of processes (each has its own generator).
Losses are printed every ``--log-every`` steps (averaged over the processes) and written by rank 0 to
``--log-dir/char_gpt/version_N/metrics.csv`` with a ``CSVLogger``; rank 0 shows the progress; at the end rank 0
prints a sample of generated text.
"""

from __future__ import annotations

import argparse
import os
import random
import re
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fabric_lite import Fabric
from fabric_lite.loggers import CSVLogger
from fabric_lite.utilities import RandomState, progress_bar

SUBJECTS = ["the cat", "a dog", "the old king", "my friend", "the robot", "a small bird", "the farmer"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "carries", "remembers"]
OBJECTS = ["the moon", "a red apple", "the river", "its shadow", "the garden", "a song", "the door"]
ENDINGS = [".", " today.", " at night.", " again.", " slowly."]


def make_text(sentences: int = 4000, seed: int = 0) -> str:
    """Sentences from a tiny grammar: the same text on every process and in every run."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        sentence = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
        if rng.random() < 0.3:
            sentence = f"{sentence[:-1]} and {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."
        lines.append(sentence)
    return "\n".join(lines) + "\n"


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=2)
        # (batch, length, dim) -> (batch, heads, length, dim / heads)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # each position sees only the past
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab_size: int, context: int = 64, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))  # (batch, length, vocab) logits

    @torch.no_grad()
    def generate(self, tokens: Tensor, length: int, generator: torch.Generator) -> Tensor:
        for _ in range(length):
            logits = self(tokens[:, -self.context :])[:, -1]
            following = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            tokens = torch.cat([tokens, following], dim=1)
        return tokens


def get_batch(data: Tensor, batch_size: int, context: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Random windows of the text and the same windows shifted by one character (the targets).

    Drawn from the global torch generator, which ``RandomState`` saves and restores with the checkpoint.
    """
    starts = torch.randint(len(data) - context - 1, (batch_size,))
    x = torch.stack([data[s : s + context] for s in starts])
    y = torch.stack([data[s + 1 : s + context + 1] for s in starts])
    return x.to(device), y.to(device)


def find_checkpoint(resume: str, folder: Path) -> Path | None:
    """The file ``--resume`` names, or with ``--resume`` alone the newest ``step-*.ckpt`` in ``folder``."""
    if resume != "last":
        path = Path(resume)
        if not path.is_file():
            raise FileNotFoundError(f"--resume {resume}: no such checkpoint file. Omit the path to take the newest.")
        return path
    found = sorted(folder.glob("step-*.ckpt"), key=lambda p: int(re.sub(r"\D", "", p.stem)))
    return found[-1] if found else None


def train(fabric: Fabric, args: argparse.Namespace) -> None:
    text = make_text()
    alphabet = sorted(set(text))
    data = torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)

    fabric.seed_everything(1337)  # the same initial weights on every process
    model = CharGPT(len(alphabet), context=args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)
    torch.manual_seed(1337 + fabric.global_rank)  # but different batches on each process
    state = {"model": model, "optimizer": optimizer, "rng": RandomState(), "step": 0}

    folder = Path(args.checkpoint_dir)
    if args.resume is not None:
        path = find_checkpoint(args.resume, folder)
        if path is None:
            fabric.print(f"no checkpoint in {folder} yet: starting from step 0")
        else:
            fabric.load(path, state)  # model, optimizer and random generators in place, "step" written back
            fabric.print(f"resumed from {path} at step {state['step']}")
    start = int(state["step"])
    parameters = sum(p.numel() for p in model.parameters())
    fabric.print(
        f"{parameters / 1e3:.0f}k parameters, {len(alphabet)} characters, {len(text)} characters of text;"
        f" training steps {start + 1}..{args.steps} on {fabric.world_size} process(es)"
    )

    bar = progress_bar(range(start + 1, args.steps + 1), fabric=fabric, desc="char_gpt", unit="step")
    for step in bar:
        x, y = get_batch(data, args.batch_size, args.context, fabric.device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        state["step"] = step

        if step % args.log_every == 0 or step == args.steps:
            mean_loss = fabric.all_reduce(loss.detach(), reduce_op="mean")  # every process must call it
            fabric.log_dict({"loss": mean_loss}, step=step)  # rank 0 writes the CSV row
            bar.set_postfix(loss=mean_loss)
            fabric.print(f"step {step:5d}  loss {mean_loss.item():.4f}")
        if step % args.save_every == 0 or step == args.steps:
            path = folder / f"step-{step:06d}.ckpt"
            fabric.save(path, state)  # every process calls it; rank 0 writes, atomically
            fabric.print(f"saved {path}")

    if fabric.is_global_zero:
        prompt = torch.tensor([[alphabet.index(c) for c in "the "]], device=fabric.device)
        # model.module: the plain module, so that rank 0 alone can run it (no DDP collective)
        tokens = model.module.generate(prompt, 120, torch.Generator(fabric.device).manual_seed(0))
        print("sample:\n" + "".join(alphabet[int(i)] for i in tokens[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default=None, help="processes (CPU) or GPUs; default 2, or torchrun's")
    parser.add_argument("--steps", type=int, default=300, help="train until this step")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per process and step")
    parser.add_argument("--context", type=int, default=64, help="characters the model sees")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--log-every", type=int, default=25, help="steps between printed and logged losses")
    parser.add_argument("--checkpoint-dir", default=os.path.join("checkpoints", "char_gpt"))
    parser.add_argument("--log-dir", default="logs", help="the CSVLogger's root folder")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="last",
        default=None,
        metavar="CHECKPOINT",
        help="continue from CHECKPOINT, or without a value from the newest checkpoint in --checkpoint-dir",
    )
    args = parser.parse_args()
    for name in ("steps", "save_every", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give a positive number of steps")
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # torchrun or fabric-lite run started the processes
    devices = args.devices if args.devices is not None else ("auto" if launched else 2)
    fabric = Fabric(accelerator=args.accelerator, devices=devices, loggers=CSVLogger(args.log_dir, name="char_gpt"))
    fabric.launch()
    train(fabric, args)


if __name__ == "__main__":
    main()
