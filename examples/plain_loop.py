"""A plain PyTorch training loop: the "before" of examples/fabric_loop.py.

    python examples/plain_loop.py                 # 5 epochs on the CPU, one process
    python examples/plain_loop.py --epochs 2      # a short run
    diff examples/plain_loop.py examples/fabric_loop.py    # what the conversion changes

A small MLP learns a smooth function of 8 inputs from generated data. The loss of every epoch is printed with
six decimals; ``python examples/fabric_loop.py --devices 1`` prints exactly the same numbers.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int = 2048, dim: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator)
    w = torch.randn(dim, 1, generator=generator)
    y = torch.sin(x @ w / dim**0.5) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def train(epochs: int, batch_size: int, device: torch.device, checkpoint: str | None) -> None:
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model = model.to(device)
    loader = DataLoader(make_data(), batch_size=batch_size, shuffle=True)

    print("training on 1 process")
    for epoch in range(epochs):
        total = torch.zeros((), device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        mean = total / len(loader)
        print(f"epoch {epoch + 1} loss {mean.item():.6f}")
    if checkpoint:
        torch.save(model.state_dict(), checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint", default=None, help="where to save the weights at the end (default: nowhere)")
    args = parser.parse_args()
    train(args.epochs, args.batch_size, torch.device(args.device), args.checkpoint)


if __name__ == "__main__":
    main()
