"""Two "hosts" on this machine: two Linux network namespaces joined by a veth pair.

Each namespace has one end of the pair, an address that exists only inside it (``10.231.0.1`` and ``10.231.0.2``,
``/24``), its own loopback and port space, and no route anywhere else: a process started with
``ip netns exec <namespace>`` can reach the other host over the veth link and nothing else. Taking the link down
(:func:`set_link`) or killing one host's processes is what losing a machine looks like to the other.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's ``ip``. Names are unique per run, and
:func:`two_hosts` deletes both namespaces (which destroys the veth pair) on the way out, even after a failure;
namespaces left by a run that was killed outright are deleted by the next one.

    python -m tests.helpers.cluster.netns check   # can this machine make the namespaces? (exit 0 if so, else why not)
    python -m tests.helpers.cluster.netns down    # delete the namespaces of test runs that were killed outright
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "fabric_lite_"
_NAME = re.compile(rf"^{PREFIX}(\d+)_[0-9a-f]{{6}}_[01]$")
SUBNET = "10.231.0"


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its end of the veth pair and that end's address."""

    namespace: str
    interface: str
    address: str

    def prefix(self) -> list[str]:
        """The command prefix that runs a command on this host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")


def namespaces() -> list[str]:
    """The names of every network namespace on this machine."""
    done = _ip("netns", "list")
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def unavailable_reason() -> str | None:
    """Why two hosts cannot be made here (``None`` when they can): not Linux, not root, no ``ip``, or the
    kernel or a container refusing to create a namespace."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): run the tests as root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is missing: install it (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:6]}_0"
    try:
        done = _ip("netns", "add", probe)
        if done.returncode != 0:
            return f"`ip netns add` is refused here: {done.stderr.strip()} (a container without CAP_SYS_ADMIN?)"
    finally:
        _ip("netns", "del", probe)
    return None


def remove_stale() -> list[str]:
    """Delete the namespaces of runs whose process is gone (killed before their teardown ran)."""
    removed = []
    for name in namespaces():
        match = _NAME.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            _ip("netns", "del", name)
            removed.append(name)
    return removed


def set_link(host: Host, up: bool) -> None:
    """Bring ``host``'s end of the veth pair up or down (down: the other host's packets go nowhere)."""
    _must("-n", host.namespace, "link", "set", host.interface, "up" if up else "down")


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Create two namespaces joined by a veth pair; delete them on the way out, whatever happened."""
    remove_stale()
    run = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
    hosts = tuple(Host(f"{PREFIX}{run}_{i}", f"fl{run[-6:]}{i}", f"{SUBNET}.{i + 1}") for i in range(2))
    a, b = hosts
    created: list[str] = []
    try:
        for host in hosts:
            _must("netns", "add", host.namespace)
            created.append(host.namespace)
        # both ends are created directly inside their namespaces: nothing ever appears on the real host
        pair = ["type", "veth", "peer", "name", b.interface, "netns", b.namespace]
        _must("link", "add", a.interface, "netns", a.namespace, *pair)
        for host in hosts:
            _must("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _must("-n", host.namespace, "link", "set", "lo", "up")
            _must("-n", host.namespace, "link", "set", host.interface, "up")
        yield a, b
    finally:
        for name in created:
            _ip("netns", "del", name)  # deleting a namespace destroys its end of the pair, and so the pair
        left = [name for name in created if name in namespaces()]
        if left:
            raise RuntimeError(f"could not delete network namespaces {left}: delete them with `ip netns del`")


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "check":
        reason = unavailable_reason()
        print(reason or "two hosts can be made here")
        return 1 if reason else 0
    if command == "down":
        for name in remove_stale():
            print(f"deleted {name}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
