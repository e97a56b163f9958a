"""The fixtures litgpt 0.5.13's own test files expect from their ``conftest.py``, which litgpt's source
distribution on PyPI does not ship (nor the data files some fixtures copy).

``.ci/setup-litgpt`` copies this file as ``conftest.py`` next to those test files. It is written here from what the
tests use (fixture names and what they must return), and makes its data itself: the ``alpaca`` file is generated,
with the fields litgpt's data modules read and deterministic contents.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
import torch

_WORDS = re.findall(
    r"\w+",
    "the model reads every token of a sentence and learns which word comes next while the loss goes down across"
    " steps on a small machine with two processes and one checkpoint per interval",
)


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _records(seed: int, count: int, fields: dict[str, tuple[int, int]]) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{name: _text(rng, *bounds) for name, bounds in fields.items()} for _ in range(count)]


@pytest.fixture(autouse=True)
def _restore_default_dtype():  # type: ignore[no-untyped-def]
    torch.set_default_dtype(torch.float32)
    yield


@pytest.fixture(autouse=True)
def _destroy_process_group():  # type: ignore[no-untyped-def]
    yield
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture()
def fake_checkpoint_dir(tmp_path: Path) -> Path:
    """An empty checkpoint folder as litgpt's scripts expect it (the tests mock what reads the files); the working
    directory moves to ``tmp_path``."""
    os.chdir(tmp_path)
    folder = tmp_path / "checkpoints" / "tmp"
    folder.mkdir(parents=True)
    for name in ("lit_model.pth", "model_config.yaml", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).touch()
    return folder


class _AnyTensor:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.Tensor)


class _AnyFloat:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, float)


@pytest.fixture()
def tensor_like() -> _AnyTensor:
    """Equal to any tensor (for ``mock.assert_called_with``)."""
    return _AnyTensor()


@pytest.fixture()
def float_like() -> _AnyFloat:
    """Equal to any float, not an int."""
    return _AnyFloat()


@pytest.fixture()
def turn_off_tf32_and_set_seed(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    torch.manual_seed(42)
    yield
    torch.seed()


class _CharTokenizer:
    """Every character is its code point; 0 is BOS and 1 EOS."""

    bos_id = 0
    eos_id = 1

    def encode(self, text: str, bos: bool | None = None, eos: bool = False, max_length: int = -1) -> torch.Tensor:
        ids = ([self.bos_id] if bos else []) + [ord(c) for c in text] + ([self.eos_id] if eos else [])
        return torch.tensor(ids[:max_length] if max_length > 0 else ids)

    def decode(self, tokens: torch.Tensor) -> str:
        return "".join(chr(int(t)) for t in tokens.tolist())


@pytest.fixture()
def mock_tokenizer() -> _CharTokenizer:
    return _CharTokenizer()


@pytest.fixture()
def alpaca_path(tmp_path: Path) -> Path:
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(_records(1, 23, {"instruction": (3, 20), "input": (0, 15), "output": (2, 60)})))
    return path
