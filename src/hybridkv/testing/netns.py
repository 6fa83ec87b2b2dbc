"""Run the calling thread inside a private network namespace that has only loopback.

Mooncake's transfer ports (every client, including one embedded in this process) listen on all
interfaces even when given ``127.0.0.1``. Tests and benchmarks therefore move *this* thread into
a fresh network namespace, where ``lo`` is the only interface, before starting anything:

    with loopback_netns():
        cluster = MooncakeCluster(...).start()   # child processes inherit the namespace
        store = MooncakeStore(...)               # threads started from here inherit it too

Linux namespaces are per thread: threads and processes created by this thread while inside
inherit the namespace; threads that already existed stay where they were. On exit the thread
returns to its original namespace; the private one disappears once nothing in it is left
(stop every child process started inside before leaving).

Needs ``CAP_SYS_ADMIN`` (root) and Linux. This is the ``unshare(2)`` system call that
``unshare -n`` uses, plus ``setns(2)`` to come back; no ``ip`` command is needed (``lo`` is
brought up with an ``ioctl``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct
from collections.abc import Iterator

__all__ = ["NetnsUnavailable", "loopback_netns", "non_loopback_interfaces", "netns_supported"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class NetnsUnavailable(RuntimeError):
    """A private network namespace cannot be created here (no privilege or no kernel support)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _set_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def non_loopback_interfaces() -> list[str]:
    """Names of the network interfaces, other than ``lo``, visible to the calling thread."""
    return [name for _, name in socket.if_nameindex() if name != "lo"]


@contextlib.contextmanager
def loopback_netns() -> Iterator[None]:
    """Move the calling thread into a new network namespace with only ``lo`` (up); restore on exit.

    Raises:
        NetnsUnavailable: the namespace could not be created (not root, seccomp, not Linux).
    """
    try:
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    except OSError as exc:
        raise NetnsUnavailable(f"cannot open this thread's network namespace: {exc}") from exc
    libc = _libc()
    try:
        if libc.unshare(_CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsUnavailable(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
        try:
            _set_loopback_up()
            yield
        finally:
            if libc.setns(original, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back to the original network namespace failed: "
                              f"{os.strerror(err)}")
    finally:
        os.close(original)


def netns_supported() -> bool:
    """Whether :func:`loopback_netns` works here (tries it once, leaving nothing behind)."""
    try:
        with loopback_netns():
            return not non_loopback_interfaces()
    except (NetnsUnavailable, OSError):
        return False
