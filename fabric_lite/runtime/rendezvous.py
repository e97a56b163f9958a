"""Forming and ending the default process group: the rendezvous store, ``init_process_group`` with an error that
says how many ranks arrived, and a teardown that lets gloo's threads finish first."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from fabric_lite._log import get_logger
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.runtime.diagnostics import CollectiveTimeoutError, is_timeout

log = get_logger(__name__)

#: the store's counter of the ranks that reached the rendezvous, named in the error when the group does not form
_JOINED_KEY = "fabric_lite/joined"
#: how long the teardown sleeps after destroying a group (see :func:`destroy_process_group`)
_WORKER_DRAIN_SECONDS = 0.05
#: connections the listening socket queues before the store's server accepts them
_BACKLOG = 2048


def listen(environment: ClusterEnvironment, rank: int) -> socket.socket:
    """A socket listening on the environment's main port (0: a free one) on every interface, for :func:`create_store`. A
    forking launcher binds it before the fork: a worker forked while the store's server thread held the C resolver's
    lock would hang in its first lookup. Raises ``RuntimeError`` when the port is in use."""
    address, port = environment.main_address, environment.main_port
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=_BACKLOG)
        return socket.create_server(("", port), backlog=_BACKLOG)
    except OSError as err:
        raise _unreachable(rank, "host", address, port, err) from err


def create_store(
    environment: ClusterEnvironment,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    is_master: bool,
    listener: socket.socket | None = None,
) -> Any:
    """The job's ``TCPStore``, hosted here (``is_master``, on ``listener`` or a socket :func:`listen` opens) or reached.
    Raises ``RuntimeError``, naming the address and port, when the port is missing, in use or unreachable."""
    address, port = environment.main_address, environment.main_port
    if not is_master and port == 0:
        raise RuntimeError(
            f"Rank {rank} cannot reach the main process: MASTER_PORT is not set. Start every node with the same"
            " MASTER_ADDR and MASTER_PORT."
        )
    fd = None
    if is_master:
        listener = listener or listen(environment, rank)
        port = listener.getsockname()[1]
        fd = listener.detach()
    try:
        return dist.TCPStore(  # type: ignore[attr-defined]
            address,
            port,
            world_size=world_size,
            is_master=is_master,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    except (RuntimeError, OSError) as err:
        if fd is not None:
            os.close(fd)
        raise _unreachable(rank, "host" if is_master else "reach", address, port, err) from err


def _unreachable(rank: int, role: str, address: str, port: int, err: Exception) -> RuntimeError:
    return RuntimeError(
        f"Rank {rank} could not {role} the rendezvous store at {address}:{port} ({err}). If the port is in use,"
        " pick a free MASTER_PORT (or unset it to let fabric_lite choose one)."
    )


#: how many default process groups this process has formed through :func:`form_process_group`
_groups_formed = 0


def form_process_group(
    *,
    backend: str,
    rank: int,
    world_size: int,
    store: Any,
    timeout: timedelta,
    device: torch.device | None,
    where: str,
) -> None:
    """``init_process_group`` over ``store``, bound to ``device`` where it is a CUDA device. Raises
    :class:`CollectiveTimeoutError` when the group does not form within ``timeout``, saying how many ranks reached the
    rendezvous at ``where``."""
    global _groups_formed
    if _groups_formed:
        # a group formed again on the same store (the first one destroyed, as in a second Fabric of a launched
        # script): the first group's keys are still there, and gloo would connect to its closed sockets. The ranks
        # form their groups in step, so every rank counts the same
        store = dist.PrefixStore(f"group{_groups_formed}/", store)  # type: ignore[attr-defined]
    kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size, "timeout": timeout}
    if device is not None and device.type == "cuda":
        kwargs["device_id"] = device
    store.add(_JOINED_KEY, 1)
    log.debug("initialising the process group: rank %d of %d", rank, world_size)
    try:
        dist.init_process_group(store=store, **kwargs)
    except RuntimeError as err:
        if not is_timeout(err):
            raise
        raise CollectiveTimeoutError(
            f"The process group did not form within {timeout}: {_read_counter(store, _JOINED_KEY)} of {world_size}"
            f" ranks joined the rendezvous at {where}. The missing ranks never started, crashed before joining, or"
            " were given another address or port."
        ) from err
    _groups_formed += 1


def destroy_process_group() -> None:
    """Destroy the default process group, then sleep briefly: a gloo worker thread still waiting for the GIL to release
    a work object when the interpreter finalises aborts the process."""
    dist.destroy_process_group()
    time.sleep(_WORKER_DRAIN_SECONDS)


def _read_counter(store: Any, key: str) -> int | str:
    try:
        return int(store.add(key, 0))
    except Exception:  # diagnosis only
        return "an unknown number"
