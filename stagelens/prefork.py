"""Is this process one of several workers of one server? Read from what a worker can see.

Why it matters: a pre-fork server (``uvicorn --workers N``, gunicorn, hypercorn, any server
that binds its port once and lets several processes accept on it) hands each connection to
whichever worker accepts it, ``/metrics`` scrapes included. Each worker keeps its own
prometheus-client values, so without ``PROMETHEUS_MULTIPROC_DIR`` every scrape reads one
worker: counters jump back and forth between scrapes, ``rate()`` sees resets, and every
SLO ratio is quietly wrong.

What defines such a worker, and what it can see: the listening socket it accepts on is
shared, the very same socket (one inode), with its siblings and usually its parent (the
supervisor that bound it). uvicorn passes the socket to each spawned worker, gunicorn's
workers inherit it at fork; both keep it in the parent. So, on Linux (``/proc``):

1. this process's server sockets: its stream sockets that listen, or are bound and
   connected to nothing (uvicorn's workers each call ``listen()`` as they start serving,
   so the first to import the app may hold the socket before anyone listens on it);
2. its siblings (the other children of its parent) holding one of those same sockets;
3. its parent holding one: then it is a worker, even while it is the only one so far (the
   next may not have been started yet).

The server is named from what the worker carries of it (gunicorn exports
``SERVER_SOFTWARE``; uvicorn, hypercorn and granian are imported in their workers), else
``unknown``.

What it cannot see: workers that each bind their own socket (``SO_REUSEPORT`` servers:
one port, several sockets); servers that pass accepted connections to their workers
instead of a listening socket; systems without ``/proc`` (macOS, Windows); a worker whose
siblings run as another user (their descriptors are unreadable: only the parent's
sharing is then seen, and the count is a lower bound). Several replicas behind a load
balancer are not several workers: each is a scrape target of its own and reads right.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
"""Where Linux shows processes."""

_SERVERS: Final = ("gunicorn", "uvicorn", "hypercorn", "granian", "daphne")
"""Servers named by a module of that name loaded in the worker, most specific first
(gunicorn's uvicorn worker class loads both: gunicorn is the one that forks)."""


@dataclass(frozen=True)
class Workers:
    """This process among the workers of one server."""

    server: str
    """The server's name (``uvicorn``, ``gunicorn``, ...) or ``unknown``."""
    pids: tuple[int, ...]
    """This process first, then every sibling accepting on the same socket."""
    parent: int
    """The process that started them (the server's supervisor)."""

    @property
    def count(self) -> int:
        """How many workers accept on this process's socket, itself included."""
        return len(self.pids)


def _socket_inodes(proc: Path, pid: int | str) -> set[int]:
    """The inodes of the sockets ``pid`` holds (empty when it cannot be read: gone, or
    another user's)."""
    found: set[int] = set()
    try:
        entries = os.listdir(proc / str(pid) / "fd")
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError):
            target = os.readlink(proc / str(pid) / "fd" / entry)
            if target.startswith("socket:["):
                found.add(int(target[len("socket:[") : -1]))
    return found


def server_socket_inodes(proc: Path = PROC) -> set[int]:
    """The inodes of this process's server sockets (``_serves``)."""
    found: set[int] = set()
    try:
        entries = os.listdir(proc / "self" / "fd")
    except OSError:
        return found
    for entry in entries:
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(proc / "self" / "fd" / entry)
            if target.startswith("socket:[") and _serves(int(entry)):
                found.add(int(target[len("socket:[") : -1]))
    return found


def _serves(fd: int) -> bool:
    """Whether descriptor ``fd`` is a server socket: a stream socket that listens, or is
    bound to an address and connected to no peer (about to listen: uvicorn's supervisor
    binds the socket and each worker calls ``listen()`` as it starts serving, so a worker
    importing the app may hold it before anyone listens). Asked of a duplicate: closing it
    leaves the server's own descriptor untouched."""
    copy = os.dup(fd)
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        raise
    with sock:
        if sock.type != socket.SOCK_STREAM:
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return True
        try:
            sock.getpeername()
            return False  # connected: a client's or a pipe's end, never a server's
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                return False
        address = sock.getsockname()
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return bool(address[1])  # port 0: never bound
        return bool(address)  # a Unix socket: bound to a path (or an abstract name)


def _parent_of(proc: Path, pid: int | str) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _children(proc: Path, parent: int) -> Iterable[int]:
    """The children of ``parent``: from its threads' ``children`` lists where the kernel
    keeps them, else by reading every process's parent."""
    try:
        tasks = os.listdir(proc / str(parent) / "task")
        listed = [(proc / str(parent) / "task" / t / "children").read_text() for t in tasks]
        return {int(pid) for text in listed for pid in text.split()}
    except OSError:
        pids = (entry for entry in os.listdir(proc) if entry.isdigit())
        return {int(pid) for pid in pids if _parent_of(proc, pid) == parent}


def server_name(environ: Mapping[str, str] | None = None) -> str:
    """The server this worker runs in, from what the worker carries of it."""
    env = os.environ if environ is None else environ
    software = env.get("SERVER_SOFTWARE", "").split("/")[0].strip().lower()
    if software in _SERVERS:
        return software
    return next((name for name in _SERVERS if name in sys.modules), "unknown")


def find_workers(proc: Path = PROC) -> Workers | None:
    """This process among its server's workers, or None when it accepts on no socket that
    its parent or a sibling shares (a single-process server, a script, a test) or when
    ``/proc`` cannot be read. Reads ``/proc``; never raises."""
    try:
        mine = server_socket_inodes(proc)
        if not mine:
            return None
        me = os.getpid()
        parent = os.getppid()
        if parent == 0:  # the first process of its namespace: no parent to share with
            return None
        siblings = sorted(
            pid for pid in _children(proc, parent) if pid != me and _socket_inodes(proc, pid) & mine
        )
        if not siblings and not _socket_inodes(proc, parent) & mine:
            return None
        return Workers(server=server_name(), pids=(me, *siblings), parent=parent)
    except (OSError, ValueError):
        return None
