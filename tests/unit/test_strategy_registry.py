"""``STRATEGY_REGISTRY`` with Lightning Fabric's registry API, and a strategy registered as Lightning documents it
running in ``Fabric(strategy=NAME)``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy, _StrategyRegistry
from fabric_lite.strategies.registry import StrategyEntry


class BucketedDDP(DDPStrategy):
    """A user's DDP strategy with a constructor argument of its own."""

    def __init__(self, bucket: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bucket = bucket


@pytest.fixture
def registered() -> Iterator[None]:
    STRATEGY_REGISTRY.register("bucketed_ddp", BucketedDDP, description="DDP in buckets", bucket=25)
    STRATEGY_REGISTRY.register("bucketed_spawn", BucketedDDP, bucket=5, start_method="spawn")
    try:
        yield
    finally:
        STRATEGY_REGISTRY.remove("bucketed_ddp")
        STRATEGY_REGISTRY.remove("bucketed_spawn")


def test_a_strategy_registered_as_lightning_documents_runs_in_fabric(registered: None) -> None:
    fabric = Fabric(strategy="bucketed_ddp", accelerator="cpu", devices=2)
    strategy = fabric.strategy
    assert type(strategy) is BucketedDDP and strategy.bucket == 25  # type: ignore[attr-defined]
    assert (strategy.world_size, strategy.start_method) == (2, "popen")  # DDPStrategy's own default
    assert type(strategy.launcher).__name__ == "SubprocessScriptLauncher"  # the plan knew it: fabric.launch() works
    assert strategy.parallel_devices == [torch.device("cpu")] * 2
    spawned = Fabric(strategy="bucketed_spawn", accelerator="cpu", devices=2).strategy
    assert (spawned.start_method, spawned.bucket) == ("spawn", 5)  # type: ignore[attr-defined]
    assert type(spawned.launcher).__name__ == "MultiProcessingLauncher"


def test_entries_read_as_lightnings(registered: None) -> None:
    entry = STRATEGY_REGISTRY["bucketed_ddp"]
    assert dict(entry) == {
        "strategy": BucketedDDP,
        "strategy_name": "bucketed_ddp",
        "description": "DDP in buckets",
        "init_params": {"bucket": 25},
    }
    assert STRATEGY_REGISTRY["ddp_spawn"]["init_params"] == {"start_method": "spawn"}
    assert STRATEGY_REGISTRY["ddp_spawn"]["strategy"] is DDPStrategy
    assert STRATEGY_REGISTRY["fsdp"]["strategy_name"] == "fsdp"
    assert "bucketed_ddp" in STRATEGY_REGISTRY.available_strategies()


def test_register_get_remove_and_the_decorator() -> None:
    registry = _StrategyRegistry()
    returned = registry.register("single", SingleDeviceStrategy, description="one", device="cpu")
    assert returned is SingleDeviceStrategy
    built = registry.get("single")
    assert type(built) is SingleDeviceStrategy and built.root_device == torch.device("cpu")

    @registry.register("decorated", bucket=3)
    class Decorated(BucketedDDP): ...

    assert registry.get("decorated").bucket == 3
    assert registry["decorated"]["description"] == ""
    assert (registry["decorated"].parallel, registry["decorated"].start_method) == (True, "popen")
    with pytest.raises(ValueError, match=r"'single' is already present in the registry\. HINT: Use `override=True`"):
        registry.register("single", Decorated)
    registry.register("single", Decorated, override=True)
    assert type(registry.get("single")) is Decorated
    with pytest.raises(TypeError, match="`name` must be a str"):
        registry.register(3, Decorated)  # type: ignore[arg-type]
    fallback = SingleDeviceStrategy()
    assert registry.get("missing", fallback) is fallback
    with pytest.raises(KeyError, match=r"'missing' not found in registry\. Available names: decorated, single"):
        registry.get("missing")
    registry.remove("decorated")
    assert registry.available_strategies() == ["single"]
    assert str(registry) == "Registered Strategies: single"


def test_any_callable_registers_as_in_lightning() -> None:
    registry = _StrategyRegistry()

    class NotAStrategy:
        def __init__(self, a: int) -> None:
            self.a = a

    registry.register("plain", NotAStrategy, a=1)
    assert registry.get("plain").a == 1
    assert (registry["plain"].parallel, registry["plain"].start_method) == (False, None)


def test_an_entry_set_directly_gets_its_name() -> None:
    registry = _StrategyRegistry()
    registry["mine"] = StrategyEntry("DDPStrategy", True, "popen", "mine", {"start_method": "popen"})
    assert registry["mine"]["strategy_name"] == "mine" and registry["mine"].load() is DDPStrategy
    assert type(registry.get("mine")) is DDPStrategy


#: Lightning Fabric 2.6.6's registered names (its tests_fabric/strategies/test_registry.py lists the same)
LIGHTNING_NAMES = {
    *("ddp", "ddp_find_unused_parameters_true", "ddp_spawn", "ddp_fork", "ddp_notebook", "dp"),
    *("fsdp", "fsdp_cpu_offload", "xla", "xla_fsdp", "single_xla", "single_tpu"),
    *("deepspeed", "deepspeed_stage_1", "deepspeed_stage_1_offload", "deepspeed_stage_2", "deepspeed_stage_2_offload"),
    *("deepspeed_stage_3", "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme"),
}


def test_the_listing_is_lightnings_and_fabric_lites_names_are_aliases() -> None:
    assert set(STRATEGY_REGISTRY.available_strategies()) == set(STRATEGY_REGISTRY) == LIGHTNING_NAMES
    assert (
        set(STRATEGY_REGISTRY.aliases)
        == {
            "single_device",
            "horovod",
            *(
                f"ddp{how}_find_unused_parameters_{value}"
                for how in ("", "_spawn", "_fork", "_notebook")
                for value in ("true", "false")
            ),
        }
        - LIGHTNING_NAMES
    )
    for alias in STRATEGY_REGISTRY.aliases:
        assert alias in STRATEGY_REGISTRY and STRATEGY_REGISTRY[alias]["strategy_name"] == alias
    assert type(STRATEGY_REGISTRY.get("single_device")) is SingleDeviceStrategy
    assert STRATEGY_REGISTRY["horovod"].class_name == "HorovodStrategy"  # horovodrun's processes, built on first use
    spawn_false = STRATEGY_REGISTRY["ddp_spawn_find_unused_parameters_false"]
    assert (spawn_false.start_method, spawn_false["init_params"]) == (
        "spawn",
        {"start_method": "spawn", "find_unused_parameters": False},
    )
    # an alias still works in Fabric(strategy=...)
    assert type(Fabric(strategy="single_device", accelerator="cpu").strategy) is SingleDeviceStrategy
    strategy = Fabric(strategy="ddp_fork_find_unused_parameters_true", accelerator="cpu", devices=2).strategy
    assert (type(strategy), strategy.start_method) == (DDPStrategy, "fork")
    # and a name registered later takes precedence; removing it brings the alias back
    STRATEGY_REGISTRY.register("single_device", BucketedDDP, override=True, bucket=7)
    try:
        assert type(STRATEGY_REGISTRY.get("single_device")) is BucketedDDP
        assert "single_device" in STRATEGY_REGISTRY.available_strategies()
    finally:
        STRATEGY_REGISTRY.remove("single_device")
    assert STRATEGY_REGISTRY["single_device"].class_name == "SingleDeviceStrategy"
    with pytest.raises(KeyError):
        STRATEGY_REGISTRY.remove("horovod")  # an alias is not an entry
    assert _StrategyRegistry().aliases == {} and "single_device" not in _StrategyRegistry()
