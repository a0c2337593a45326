"""Real PostgreSQL and Redis on loopback for the tests: throwaway instances in temp dirs.

Why real servers: the ledger's upserts, its locking under concurrent writers and the rate
limiter's Lua script must be proven on the engines that will run them. Debian's
``postgresql`` (``initdb``/``pg_ctl`` from ``/usr/lib/postgresql/<version>/bin``) starts in
about two seconds with fsync off; ``redis-server`` at once with persistence off.
PostgreSQL refuses to run as root: as root the cluster is run as the ``postgres`` user that
Debian's package creates.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests._scaffold import free_port

REDIS_SERVER = "/usr/bin/redis-server"


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with ``initdb``, or None."""
    root = Path("/usr/lib/postgresql")
    found = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


def _wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
        time.sleep(0.05)


def _as_postgres(cmd: list[str]) -> list[str]:
    """``cmd`` run as the ``postgres`` user when we are root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def running_postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster on a free loopback port; yields its URL (database
    ``stagelens``, user ``stagelens``, password ``secret``). Stopped and deleted on exit."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL (Debian's postgresql package) is not installed")
    root = Path(tempfile.mkdtemp(prefix="stagelens-pg-"))
    data = root / "data"
    pwfile = root / "pw"
    pwfile.write_text("secret\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    port = free_port()
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "stagelens",
                    "-A",
                    "scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--no-sync",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        options = (
            f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root} "
            "-c fsync=off"
        )
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(root / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        env = {**os.environ, "PGPASSWORD": "secret"}
        subprocess.run(
            [
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "stagelens",
                "stagelens",
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        yield f"postgresql://stagelens:secret@127.0.0.1:{port}/stagelens"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """A redis-server on a free loopback port, persistence off; yields its URL."""
    if not Path(REDIS_SERVER).exists():
        raise FileNotFoundError("redis-server (Debian's redis-server package) is not installed")
    root = Path(tempfile.mkdtemp(prefix="stagelens-redis-"))
    port = free_port()
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_port(port, 10, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
