"""A tiny litgpt model, tokenizer and data, made locally (no download), for running litgpt's entry points on the CPU
under Lightning Fabric and under fabric_lite (tests/tiers/litgpt/test_litgpt.py).

``python -m tests.helpers.litgpt.tiny FOLDER`` writes:

* ``FOLDER/checkpoint/``: ``model_config.yaml`` (a 2-layer Llama-style model, 32-wide), ``lit_model.pth`` (its
  weights, drawn with a fixed seed), ``tokenizer.json`` (one token per character of :data:`ALPHABET`, with
  ``<s>``/``</s>``/``<unk>``) and ``tokenizer_config.json``: what litgpt's finetuning and generation scripts read.
* ``FOLDER/sft.json``: instruction data for ``--data JSON``.
* ``FOLDER/pretrain.yaml``: a ``litgpt pretrain --config`` file that trains the same architecture from scratch on
  :class:`TinyText`.

Everything is deterministic: two runs write the same bytes.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from tests.helpers.resumable import ResumableLoader

ALPHABET = " abcdefghijklmnopqrstuvwxyz.,"
SPECIAL = ["<unk>", "<s>", "</s>"]
VOCAB = {token: index for index, token in enumerate([*SPECIAL, *ALPHABET])}
#: the sequence length for training (prompts for generation, with their template, need the model's longer block)
BLOCK_SIZE = 32
MODEL = {
    "name": "tiny-llama",
    "block_size": 256,
    "vocab_size": len(VOCAB),
    "padded_vocab_size": 32,
    "n_layer": 3,  # litgpt's adapters start at layer 2
    "n_head": 4,
    "n_query_groups": 2,
    "n_embd": 32,
    "rotary_percentage": 1.0,
    "parallel_residual": False,
    "bias": False,
    "norm_class_name": "RMSNorm",
    "mlp_class_name": "LLaMAMLP",
    "intermediate_size": 64,
}
_SENTENCES = "the cat sat on a mat. a dog ran to the park, and the bird sang. we read, we write, we learn."
_WORDS = _SENTENCES.split(" ")


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def encode(value: str) -> list[int]:
    return [VOCAB.get(char, 0) for char in value]


class TinyText:
    """Character sequences of ``max_seq_length + 1`` tokens for ``litgpt pretrain``, cut from generated text, in a
    :class:`ResumableLoader`.

    A litgpt ``DataModule`` (the class is made one by :func:`_as_data_module`, so that this file imports without
    litgpt); pass it as ``--data tests.helpers.litgpt.tiny.TinyText``. ``shuffle=False`` gives two processes (each a
    ``DistributedSampler`` shard) the same samples in a step as one process.
    """

    def __init__(self, samples: int = 48, val_samples: int = 8, seed: int = 7, shuffle: bool = True) -> None:
        self.samples = samples
        self.val_samples = val_samples
        self.seed = seed
        self.shuffle = shuffle
        self.batch_size = 1
        self.max_seq_length = BLOCK_SIZE

    def connect(self, tokenizer: Any = None, batch_size: int = 1, max_seq_length: int | None = None, **_: Any) -> None:
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length or BLOCK_SIZE

    def _dataset(self, count: int, seed: int) -> Dataset[torch.Tensor]:
        length = self.max_seq_length + 1
        tokens = encode(text(seed, count * length))
        rows = [torch.tensor(tokens[i * length : (i + 1) * length]) for i in range(count)]
        return _Rows(rows)

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        dataset = self._dataset(self.samples, self.seed)
        if not self.shuffle:
            return ResumableLoader(dataset, self.batch_size)
        generator = torch.Generator().manual_seed(self.seed)
        return ResumableLoader(dataset, self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self) -> DataLoader[torch.Tensor]:
        return DataLoader(self._dataset(self.val_samples, self.seed + 1), self.batch_size, shuffle=False)


class _Rows(Dataset[torch.Tensor]):
    def __init__(self, rows: list[torch.Tensor]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]


def _as_data_module() -> None:
    """Make :class:`TinyText` a subclass of ``litgpt.data.DataModule`` when litgpt is importable (the driver runs
    in litgpt's venv; the main test venv imports this file only for its constants)."""
    global TinyText
    try:
        from litgpt.data import DataModule
    except ImportError:
        return
    TinyText = type("TinyText", (TinyText, DataModule), {"__module__": __name__})  # type: ignore[misc]


_as_data_module()


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def make(folder: Path) -> None:
    import yaml
    from litgpt import GPT, Config

    checkpoint = folder / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "model_config.yaml").write_text(yaml.safe_dump(MODEL))
    torch.manual_seed(1234)
    model = GPT(Config(**MODEL))
    torch.save(model.state_dict(), checkpoint / "lit_model.pth")
    write_tokenizer(checkpoint)
    records = [
        {"instruction": text(100 + i, 4), "input": text(200 + i, 2) if i % 2 else "", "output": text(300 + i, 5)}
        for i in range(16)
    ]
    (folder / "sft.json").write_text(json.dumps(records, indent=1))
    pretrain = {
        "model_name": MODEL["name"],
        "model_config": MODEL,
        "out_dir": str(folder / "out" / "pretrain"),
        "precision": "32-true",
        "tokenizer_dir": str(checkpoint),
        "data": {"class_path": "tests.helpers.litgpt.tiny.TinyText"},
        "train": {
            "save_interval": 3,
            "log_interval": 1,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_tokens": 6 * 4 * BLOCK_SIZE,
            "max_seq_length": BLOCK_SIZE,
            "lr_warmup_steps": 2,
            "max_norm": 1.0,
            "min_lr": 0.0001,
            "tie_embeddings": False,
        },
        "eval": {"interval": 3, "max_iters": 2, "initial_validation": False, "final_validation": True},
        "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.01, "weight_decay": 0.0}},
        "devices": 1,
        "logger_name": "csv",
        "seed": 42,
    }
    (folder / "pretrain.yaml").write_text(yaml.safe_dump(pretrain))


if __name__ == "__main__":
    make(Path(sys.argv[1]))
