"""``Fabric.save``/``load``/``load_raw`` and the loggers on fsspec URLs, on one or more ranks (run by
tests/distributed/test_remote.py with ``file://`` URLs and by tests/tiers/s3/test_s3.py with ``s3://`` URLs).

Every function returns plain observations; the tests assert on them.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

from fabric_lite.utilities.cloud_io import get_filesystem


class Unpicklable:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("this object refuses to be pickled")


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _flat(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def save_load(fabric: Any, url: str) -> dict[str, Any]:
    """Save a trained model and optimizer to ``url/state.ckpt``, load them into fresh ones, ``load_raw`` a plain
    state dict written with ``torch.save`` through fsspec."""
    model = _model(0)
    fmodel, foptimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.05))
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) + fabric.global_rank  # rank-dependent data
    fabric.backward(fmodel(x).pow(2).sum())
    foptimizer.step()
    target = f"{url}/state.ckpt"
    fabric.save(target, {"model": fmodel, "optimizer": foptimizer, "step": 3})

    fresh = _model(1)
    ffresh, fopt = fabric.setup(fresh, torch.optim.Adam(fresh.parameters(), lr=0.05))
    state = {"model": ffresh, "optimizer": fopt, "step": 0}
    remainder = fabric.load(target, state)
    whole = fabric.load(target)

    raw_url = f"{url}/raw-{fabric.global_rank}.pt"
    fs = get_filesystem(raw_url)
    buffer = io.BytesIO()
    torch.save(_model(7).state_dict(), buffer)
    fs.pipe_file(raw_url, buffer.getvalue())
    raw_target = _model(2)
    fabric.load_raw(raw_url, raw_target)
    return {
        "saved": _flat(model),
        "loaded": _flat(fresh),
        "step": state["step"],
        "remainder": remainder,
        "whole_keys": sorted(whole),
        "optimizer_steps": [int(s["step"]) for s in fopt.state_dict()["state"].values()],
        "raw": _flat(raw_target) == _flat(_model(7)),
    }


def failed_save(fabric: Any, url: str) -> dict[str, Any]:
    """Save step 1, then a state that cannot be pickled to the same URL: every rank must raise, naming the URL,
    and the object at the URL must still be step 1."""
    target = f"{url}/kept.ckpt"
    fabric.save(target, {"step": 1, "weights": torch.ones(3) * 1})
    error = None
    try:
        fabric.save(target, {"step": 2, "weights": torch.ones(3) * 2, "bad": Unpicklable()})
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    fabric.barrier()
    return {"error": error, "after": fabric.load(target)["step"]}


def loggers(fabric: Any, url: str) -> dict[str, Any]:
    """Log with a ``CSVLogger`` and a ``TensorBoardLogger`` rooted at ``url`` (version 0): only rank 0 writes. Then
    every rank lists what the store holds, reads it back, and asks new loggers for their next free version."""
    from fabric_lite.loggers import CSVLogger, TensorBoardLogger

    csv_logger = CSVLogger(url, name="exp", version=0, flush_logs_every_n_steps=1)
    tb_logger = TensorBoardLogger(url, name="tb", version=0)
    for step in range(3):
        csv_logger.log_metrics({"loss": float(step + fabric.global_rank)}, step=step)
        tb_logger.log_metrics({"loss": float(step + fabric.global_rank)}, step=step)
    tb_logger.log_hyperparams({"lr": 0.1})
    csv_logger.finalize("success")
    tb_logger.finalize("success")
    fabric.barrier()
    fs = get_filesystem(url)
    fs.invalidate_cache()
    root = fs._strip_protocol(url).rstrip("/")
    objects = {name[len(root) + 1 :]: fs.size(name) for name in fs.find(root)}
    events = {name: fs.cat_file(f"{root}/{name}") for name in objects if "events.out.tfevents" in name}
    return {
        "log_dirs": [csv_logger.log_dir, tb_logger.log_dir],
        "backend": tb_logger._backend,
        "objects": objects,
        "csv": fs.cat_file(f"{csv_logger.log_dir}/metrics.csv").decode(),
        "events": events,
        "next_versions": [CSVLogger(url, name="exp").version, TensorBoardLogger(url, name="tb").version],
    }
