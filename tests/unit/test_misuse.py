"""Misuse of the public API (RELIABILITY.md case 14, plus Lightning Fabric's own checks).

Every misuse raises the exception class Lightning Fabric 2.6 raises for the same input (``LIGHTNING`` below, which
tests/distributed/test_misuse.py checks against Lightning when it is installed), with a message that names the
offending value or the fix. Every error is raised in this process, at once: no process is started, no store is
opened and nothing waits (the ``no_processes`` fixture turns any attempt into a failure).

The checks that start processes are in tests/distributed/test_misuse.py.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch import nn
from torch.utils.data import DataLoader

from fabric_lite import Fabric, seed_everything
from fabric_lite.utilities.seed import ENV_SEED

# What Lightning Fabric 2.6.6 raises for each misuse (None: Lightning accepts the input; fabric_lite is stricter).
# Checked by test_lightning_raises_the_same_classes against a real Lightning install.
LIGHTNING = {
    "setup twice": "ValueError",
    "setup wrapped optimizer": "ValueError",
    "setup_module twice": "ValueError",
    "setup_optimizers none": "ValueError",
    "setup_optimizers twice": "ValueError",
    "setup_optimizers non-optimizer": "TypeError",
    "setup_dataloaders empty": "ValueError",
    "setup_dataloaders non-DataLoader": "TypeError",
    "setup_dataloaders twice": "ValueError",
    "foreign optimizer": None,
    "backward before setup": None,  # one device; Lightning raises for DeepSpeed/XLA, fabric_lite for several processes
    "no_backward_sync unwrapped": "TypeError",
    "clip both": "ValueError",
    "clip neither": "ValueError",
    "launch non-callable": "TypeError",
    "launch no-argument function": "TypeError",
    "launch() for spawn": "TypeError",
    "setup before launch": "RuntimeError",
    "all_reduce before launch": "RuntimeError",
    "barrier before launch": "RuntimeError",
    "seed -1": "ValueError",
    "seed 2**32": "ValueError",
    "seed 'abc'": "ValueError",
    "seed '1.5'": "ValueError",
    "save non-dict": "AttributeError",  # an accidental crash in Lightning ('list' object has no attribute 'items')
    "save filter non-dict": "TypeError",
    "save filter unknown key": "ValueError",
    "save filter non-callable": "TypeError",
}


class _Forbidden(BaseException):
    """Raised by anything that would start a process or open a rendezvous; a BaseException, so no handler in the
    code under test can turn it into the expected error."""


@pytest.fixture
def no_processes(monkeypatch):
    """Fail if the code under test starts a process or opens a store, or takes more than 2 s."""
    # pay one-off import costs (torch.optim's first use takes about a second) before the clock starts
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)

    def forbidden(what):
        def call(*args, **kwargs):
            raise _Forbidden(f"{what} was called while handling a misuse")

        return call

    for owner, name in [
        (torch_mp, "start_processes"),
        (torch_mp, "spawn"),
        (subprocess, "Popen"),
        (dist, "init_process_group"),
        (dist, "TCPStore"),
        (dist, "FileStore"),
        (dist, "barrier"),
        (os, "fork"),
        (multiprocessing.Process, "start"),
        (time, "sleep"),
    ]:
        monkeypatch.setattr(owner, name, forbidden(f"{getattr(owner, '__name__', owner)}.{name}"))
    children_before = set(multiprocessing.active_children())
    start = time.monotonic()
    yield
    elapsed = time.monotonic() - start
    assert elapsed < 2.0, f"handling the misuse took {elapsed:.2f} s"
    assert set(multiprocessing.active_children()) == children_before


def _model_and_optimizer():
    model = nn.Linear(2, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _fabric(**kwargs):
    return Fabric(accelerator="cpu", devices=1, **kwargs)


# Where Lightning's class is an accident rather than a contract, fabric_lite raises the class the error deserves.
_DELIBERATE_DEVIATIONS = {"save non-dict": "TypeError"}


def _expect(case: str, exc_class: type[BaseException]) -> type[BaseException]:
    """``exc_class``, after checking that it is the class Lightning raises for ``case`` (or a documented deviation)."""
    lightning = LIGHTNING[case]
    if case in _DELIBERATE_DEVIATIONS:
        assert _DELIBERATE_DEVIATIONS[case] == exc_class.__name__
    else:
        assert lightning in (None, exc_class.__name__), f"Lightning raises {lightning} for {case!r}"
    return exc_class


# ---------------------------------------------------------------------------------------------- setup
def test_setup_twice(no_processes):
    fabric = _fabric()
    model, optimizer = _model_and_optimizer()
    fmodel, _ = fabric.setup(model, optimizer)
    with pytest.raises(_expect("setup twice", ValueError), match="only once to the `setup` method"):
        fabric.setup(fmodel)


def test_setup_with_an_already_wrapped_optimizer(no_processes):
    fabric = _fabric()
    model, optimizer = _model_and_optimizer()
    _, foptimizer = fabric.setup(model, optimizer)
    with pytest.raises(_expect("setup wrapped optimizer", ValueError), match="optimizer should be passed only once"):
        fabric.setup(nn.Linear(2, 2), foptimizer)


def test_setup_module_twice(no_processes):
    fabric = _fabric()
    fmodel = fabric.setup_module(nn.Linear(2, 2))
    with pytest.raises(_expect("setup_module twice", ValueError), match="only once to the `setup_module` method"):
        fabric.setup_module(fmodel)


def test_setup_optimizers_with_none(no_processes):
    with pytest.raises(_expect("setup_optimizers none", ValueError), match="at least one optimizer"):
        _fabric().setup_optimizers()


def test_setup_optimizers_twice(no_processes):
    fabric = _fabric()
    _, optimizer = _model_and_optimizer()
    foptimizer = fabric.setup_optimizers(optimizer)
    with pytest.raises(_expect("setup_optimizers twice", ValueError), match="only once to the `setup_optimizers`"):
        fabric.setup_optimizers(foptimizer)


def test_setup_optimizers_with_a_non_optimizer(no_processes):
    with pytest.raises(_expect("setup_optimizers non-optimizer", TypeError), match="got dict"):
        _fabric().setup_optimizers({"lr": 0.1})


def test_setup_dataloaders_empty(no_processes):
    with pytest.raises(_expect("setup_dataloaders empty", ValueError), match="at least one dataloader"):
        _fabric().setup_dataloaders()


def test_setup_dataloaders_with_a_non_dataloader(no_processes):
    with pytest.raises(_expect("setup_dataloaders non-DataLoader", TypeError), match=r"got list.*DataLoader"):
        _fabric().setup_dataloaders([1, 2, 3])


def test_setup_dataloaders_twice(no_processes):
    fabric = _fabric()
    loader = fabric.setup_dataloaders(DataLoader(range(4)))
    with pytest.raises(_expect("setup_dataloaders twice", ValueError), match="only once to the `setup_dataloaders`"):
        fabric.setup_dataloaders(loader)


def test_optimizer_of_another_module(no_processes):
    fabric = _fabric()
    model = nn.Linear(2, 2)
    other = torch.optim.SGD(nn.Linear(3, 3).parameters(), lr=0.1)
    with pytest.raises(_expect("foreign optimizer", ValueError)) as info:
        fabric.setup(model, other)
    message = str(info.value)
    assert "2 parameter(s)" in message and "Linear" in message  # what is wrong, with the numbers
    assert "model.parameters()" in message  # the fix
    # a partial optimizer (a subset of the module's parameters) is fine
    fabric.setup(model, torch.optim.SGD([model.weight], lr=0.1))


def test_optimizer_with_some_foreign_parameters_is_refused(no_processes):
    model = nn.Linear(2, 2)
    mixed = torch.optim.SGD([model.weight, nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=r"Optimizer 0 \(SGD\) updates 1 parameter"):
        _fabric().setup(model, mixed)


def test_setup_with_a_non_optimizer_after_the_module(no_processes):
    # Lightning raises TypeError here too (from a failed __class__ assignment)
    with pytest.raises(TypeError, match=r"optimizers after the module, got str"):
        _fabric().setup(nn.Linear(2, 2), "sgd")


# ---------------------------------------------------------------------------------------------- training helpers
def test_backward_before_setup_with_several_processes(no_processes):
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    loss = (torch.ones(2, requires_grad=True) * 2).sum()
    with pytest.raises(_expect("backward before setup", RuntimeError), match=r"fabric\.setup\(model, optimizer\)"):
        fabric.backward(loss)


def test_backward_before_setup_on_one_device_back_propagates(no_processes):
    # as in Lightning: with one process nothing is synchronised, so a module not set up gets its gradients
    weight = torch.ones(2, requires_grad=True)
    _fabric().backward((weight * 2).sum())
    assert torch.equal(weight.grad, torch.full((2,), 2.0))


def test_no_backward_sync_on_an_unwrapped_module(no_processes):
    fabric = _fabric()
    with pytest.raises(_expect("no_backward_sync unwrapped", TypeError)) as info:
        fabric.no_backward_sync(nn.Linear(2, 2))
    assert "Linear" in str(info.value) and "fabric.setup(" in str(info.value)


def test_clip_gradients_with_both_or_neither(no_processes):
    fabric = _fabric()
    fmodel, foptimizer = fabric.setup(*_model_and_optimizer())
    with pytest.raises(_expect("clip both", ValueError)) as info:
        fabric.clip_gradients(fmodel, foptimizer, clip_val=0.5, max_norm=2.0)
    assert "0.5" in str(info.value) and "2.0" in str(info.value)
    assert "clip_val=" in str(info.value) and "max_norm=" in str(info.value)
    with pytest.raises(_expect("clip neither", ValueError), match=r"`clip_val` or `max_norm`.*max_norm=1\.0"):
        fabric.clip_gradients(fmodel, foptimizer)


# ---------------------------------------------------------------------------------------------- launch
def _train_no_args():
    return 1


def _train(fabric):
    return fabric.global_rank


def test_launch_with_a_non_callable(no_processes):
    fabric = _fabric()
    with pytest.raises(_expect("launch non-callable", TypeError)) as info:
        fabric.launch(_train_no_args())
    assert "got 1" in str(info.value) and ".launch(your_fn)" in str(info.value)


@pytest.mark.parametrize("strategy", [None, "ddp_spawn", "ddp"])
def test_launch_with_a_function_without_arguments(no_processes, strategy):
    fabric = _fabric() if strategy is None else Fabric(accelerator="cpu", devices=2, strategy=strategy)
    with pytest.raises(_expect("launch no-argument function", TypeError)) as info:
        fabric.launch(_train_no_args)
    assert "_train_no_args" in str(info.value) and "def train(fabric)" in str(info.value)


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_launch_without_a_function_for_a_spawn_strategy(no_processes, strategy):
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    with pytest.raises(_expect("launch() for spawn", TypeError), match=r"fabric\.launch\(train\)"):
        fabric.launch()


def test_spawn_launch_while_the_script_is_being_imported_by_a_child(no_processes, monkeypatch):
    # what a spawned child sees when the script has no `if __name__ == "__main__":` guard
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    with pytest.raises(RuntimeError, match=r'if __name__ == \\?"__main__\\?":'):
        fabric.launch(_train)


# ---------------------------------------------------------------------------------------------- before launch()
def _unlaunched(strategy: str) -> Fabric:
    return Fabric(accelerator="cpu", devices=2, strategy=strategy)


_BEFORE_LAUNCH_CALLS = {
    "setup": lambda f: f.setup(nn.Linear(2, 2)),
    "setup_module": lambda f: f.setup_module(nn.Linear(2, 2)),
    "setup_optimizers": lambda f: f.setup_optimizers(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)),
    "setup_dataloaders": lambda f: f.setup_dataloaders(DataLoader(range(4))),
    "init_module": lambda f: f.init_module(),
    "all_reduce": lambda f: f.all_reduce(torch.tensor(1.0)),
    "all_gather": lambda f: f.all_gather(torch.tensor(1.0)),
    "broadcast": lambda f: f.broadcast(1),
    "barrier": lambda f: f.barrier(),
    "reduce_boolean_decision": lambda f: f.reduce_boolean_decision(True),
}


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
@pytest.mark.parametrize("call", sorted(_BEFORE_LAUNCH_CALLS))
def test_collectives_and_setup_before_launch(no_processes, strategy, call):
    fabric = _unlaunched(strategy)
    case = "setup before launch" if call.startswith(("setup", "init")) else "all_reduce before launch"
    with pytest.raises(_expect(case, RuntimeError)) as info:
        _BEFORE_LAUNCH_CALLS[call](fabric)
    message = str(info.value)
    assert "fabric.launch()" in message and "world size 2" in message


def test_single_device_needs_no_launch(no_processes):
    fabric = _fabric()
    assert fabric.all_reduce(torch.tensor(3.0)).item() == 3.0
    assert fabric.broadcast({"a": 1}) == {"a": 1}
    fabric.barrier()
    assert fabric.launch(_train) == 0


# ---------------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize(("seed", "shown"), [(-1, "-1"), (2**32, "4294967296"), (10**20, str(10**20))])
def test_seed_out_of_range(no_processes, seed, shown):
    case = "seed -1" if seed == -1 else "seed 2**32"
    before = os.environ.get(ENV_SEED)
    with pytest.raises(_expect(case, ValueError)) as info:
        seed_everything(seed)
    message = str(info.value)
    assert shown in message and "4294967295" in message
    assert os.environ.get(ENV_SEED) == before  # nothing was seeded


@pytest.mark.parametrize("seed", ["abc", "1.5", "", "0x10"])
def test_seed_that_is_not_an_integer(no_processes, seed):
    case = "seed 'abc'" if seed == "abc" else "seed '1.5'"
    with pytest.raises(_expect(case, ValueError)) as info:
        seed_everything(seed)
    assert repr(seed) in str(info.value) and "integer" in str(info.value)


def test_seed_out_of_range_through_fabric(no_processes):
    with pytest.raises(ValueError, match="4294967296"):
        Fabric.seed_everything(2**32)


def test_seed_from_a_bad_environment_variable(no_processes, monkeypatch):
    monkeypatch.setenv(ENV_SEED, "not-a-number")
    with pytest.raises(ValueError) as info:
        seed_everything()
    assert "not-a-number" in str(info.value) and ENV_SEED in str(info.value)


def test_seed_string_of_digits_is_accepted(no_processes):
    assert seed_everything("12") == 12  # as in Lightning


# ---------------------------------------------------------------------------------------------- save arguments
def test_save_with_a_non_dict_state(no_processes, tmp_path):
    fmodel = _fabric().setup(nn.Linear(2, 2))
    with pytest.raises(_expect("save non-dict", TypeError)) as info:
        _fabric().save(tmp_path / "ckpt.pt", [fmodel])
    assert "list" in str(info.value) and "{'model': model}" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_save_with_bad_filters(no_processes, tmp_path):
    fabric = _fabric()
    fmodel = fabric.setup(nn.Linear(2, 2))
    path = tmp_path / "ckpt.pt"
    with pytest.raises(_expect("save filter non-dict", TypeError), match=r"given \[1\]"):
        fabric.save(path, {"model": fmodel}, filter=[1])
    with pytest.raises(_expect("save filter unknown key", ValueError), match=r"\{'nope'\}.*\{'model'\}"):
        fabric.save(path, {"model": fmodel}, filter={"nope": lambda k, v: True})
    with pytest.raises(_expect("save filter non-callable", TypeError), match=r"key 'model'.*given 3"):
        fabric.save(path, {"model": fmodel}, filter={"model": 3})
    assert list(tmp_path.iterdir()) == []
