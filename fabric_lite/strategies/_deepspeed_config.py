"""The DeepSpeed config of ``DeepSpeedStrategy``: the user's or Lightning's default, plus the precision."""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: what ``zero_optimization.stage`` may be
STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("cpu", "nvme")
REMOTE_DEVICES = (None, "cpu", "nvme")


def load_config(config: Any, env_path: str | None) -> dict[str, Any] | None:
    """The user's config: a deep copy of a dict (the strategy writes into it), or the JSON file at a path or, with
    ``config=None``, at ``env_path``; else ``None``.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the file is not a JSON object.
        TypeError: ``config`` is neither a dict, a path nor ``None``.
    """
    if config is None and env_path:
        config = env_path
    if config is None:
        return None
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"You passed in a path to a DeepSpeed config but the path does not exist: {config}")
        try:
            loaded = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"The DeepSpeed config {str(config)!r} is not valid JSON: {err}.") from err
        if not isinstance(loaded, dict):
            raise ValueError(
                f"The DeepSpeed config {str(config)!r} holds a {type(loaded).__name__}; it must be a JSON object"
                ' such as {"zero_optimization": {"stage": 2}}.'
            )
        return loaded
    raise TypeError(
        f"DeepSpeedStrategy(config={config!r}): pass a dict, the path of a JSON file, or None (the config is then"
        " built from the other arguments)."
    )


def check_arguments(
    *,
    stage: Any,
    remote_device: Any,
    offload_params_device: Any,
    offload_optimizer_device: Any,
    logging_batch_size_per_gpu: Any,
) -> None:
    """Reject values DeepSpeed would only refuse later, in ``deepspeed.initialize`` (``ValueError``)."""
    if type(stage) is not int or stage not in STAGES:
        raise ValueError(
            f"DeepSpeedStrategy(stage={stage!r}): the ZeRO stage must be one of {STAGES} (0: data parallel, 1: the"
            " optimizer state sharded, 2: also the gradients, 3: also the parameters)."
        )
    for name, value in (
        ("offload_params_device", offload_params_device),
        ("offload_optimizer_device", offload_optimizer_device),
    ):
        if value not in OFFLOAD_DEVICES:
            raise ValueError(f"DeepSpeedStrategy({name}={value!r}) must be one of {OFFLOAD_DEVICES}.")
    if remote_device not in REMOTE_DEVICES:
        raise ValueError(
            f"DeepSpeedStrategy(remote_device={remote_device!r}) must be one of {REMOTE_DEVICES} (None: the"
            " parameters of a ZeRO-3 model are created on the device)."
        )
    size = logging_batch_size_per_gpu
    if size is not None and (type(size) is not int or size < 1):
        raise ValueError(
            f"DeepSpeedStrategy(logging_batch_size_per_gpu={size!r}) must be a positive int (the batch size of each"
            " process) or None."
        )


def default_config(
    *,
    zero_optimization: bool,
    zero_allow_untested_optimizer: bool,
    logging_batch_size_per_gpu: int | None,
    partition_activations: bool,
    cpu_checkpointing: bool,
    contiguous_memory_optimization: bool,
    synchronize_checkpoint_boundary: bool,
    offload_optimizer: bool,
    offload_parameters: bool,
    nvme_path: str,
    offload_params_device: str,
    params_buffer_count: int,
    params_buffer_size: int,
    max_in_cpu: int,
    offload_optimizer_device: str,
    optimizer_buffer_count: int,
    pin_memory: bool,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    thread_count: int,
    **zero_kwargs: Any,
) -> dict[str, Any]:
    """The config Lightning builds from these arguments, plus ``"gradient_clipping": 0.0``: recent DeepSpeed clips
    to 1.0 when the key is missing, and a loop that asked for no clipping gets none, as with every other strategy.
    ``zero_kwargs`` go into ``zero_optimization`` as they are."""
    config: dict[str, Any] = {
        "activation_checkpointing": {
            "partition_activations": partition_activations,
            "cpu_checkpointing": cpu_checkpointing,
            "contiguous_memory_optimization": contiguous_memory_optimization,
            "synchronize_checkpoint_boundary": synchronize_checkpoint_boundary,
        },
        "aio": {
            "block_size": block_size,
            "queue_depth": queue_depth,
            "single_submit": single_submit,
            "overlap_events": overlap_events,
            "thread_count": thread_count,
        },
        "gradient_clipping": 0.0,
    }
    if zero_optimization:
        zero = dict(zero_kwargs)
        if offload_optimizer:
            zero["offload_optimizer"] = {
                "device": offload_optimizer_device,
                "nvme_path": nvme_path,
                "buffer_count": optimizer_buffer_count,
                "pin_memory": pin_memory,
            }
        if offload_parameters:
            zero["offload_param"] = {
                "device": offload_params_device,
                "nvme_path": nvme_path,
                "buffer_count": params_buffer_count,
                "buffer_size": params_buffer_size,
                "max_in_cpu": max_in_cpu,
                "pin_memory": pin_memory,
            }
        config["zero_allow_untested_optimizer"] = zero_allow_untested_optimizer
        config["zero_optimization"] = zero
    if logging_batch_size_per_gpu:
        config["train_micro_batch_size_per_gpu"] = logging_batch_size_per_gpu
    return config


#: the arguments of ``DeepSpeedStrategy`` that :func:`default_config` puts into ``zero_optimization`` as they are
ZERO_SETTINGS = (
    "stage",
    "contiguous_gradients",
    "overlap_comm",
    "allgather_partitions",
    "reduce_scatter",
    "allgather_bucket_size",
    "reduce_bucket_size",
    "sub_group_size",
)


def default_config_from(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`default_config` from ``DeepSpeedStrategy``'s constructor arguments (a mapping of every argument)."""
    named = [p.name for p in inspect.signature(default_config).parameters.values() if p.kind is p.KEYWORD_ONLY]
    return default_config(**{name: arguments[name] for name in (*named, *ZERO_SETTINGS)})


def zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage the config asks for (0 without a ``zero_optimization`` section)."""
    section = config.get("zero_optimization")
    return int(section.get("stage", 0)) if isinstance(section, dict) else 0


def _enabled(section: Any) -> bool | None:
    if isinstance(section, dict):
        return bool(section.get("enabled", False))
    return None if section is None else bool(section)


def format_config(
    config: dict[str, Any],
    precision: str,
    *,
    loss_scale: float,
    loss_scale_window: int,
    min_loss_scale: int,
    initial_scale_power: int,
    hysteresis: int,
) -> None:
    """Complete ``config`` in place for ``deepspeed.initialize``: a micro-batch size of 1 unless it says one (used
    only for DeepSpeed's throughput log), and the precision as a ``"fp16"``/``"bf16"`` section unless it has one.

    Raises:
        ValueError: the config's own ``"fp16"``/``"bf16"`` section contradicts ``precision``.
    """
    if "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
        config["train_micro_batch_size_per_gpu"] = 1
    half = "fp16" if precision.startswith("16-") else "bf16" if precision.startswith("bf16-") else None
    for section in ("fp16", "bf16"):
        enabled = _enabled(config.get(section))
        if enabled and section != half:
            raise ValueError(
                f"The DeepSpeed config enables {section!r}, but Fabric(precision={precision!r}) says otherwise: the"
                f" engine would compute in {'float16' if section == 'fp16' else 'bfloat16'} while the inputs stay"
                f" {'float32' if half is None else 'in the other half type'}. Pass Fabric(precision="
                f"{'16-mixed' if section == 'fp16' else 'bf16-mixed'!r}), or remove {section!r} from the config."
            )
        if enabled is False and section == half:
            raise ValueError(
                f"Fabric(precision={precision!r}) needs DeepSpeed's {section!r} section enabled, but the config sets"
                f' "{section}": {{"enabled": false}}. Remove that section (fabric_lite then writes it), or choose'
                " precision='32-true'."
            )
    if half == "fp16" and "fp16" not in config:
        config["fp16"] = {
            "enabled": True,
            "loss_scale": loss_scale,
            "initial_scale_power": initial_scale_power,
            "loss_scale_window": loss_scale_window,
            "hysteresis": hysteresis,
            "min_loss_scale": min_loss_scale,
        }
    elif half == "bf16" and "bf16" not in config:
        config["bf16"] = {"enabled": True}
