"""Which usage ledger a URL names: the SQLite file or the PostgreSQL database.

Why apart from ``ledger`` and ``ledger_postgres``: the PostgreSQL ledger builds on the
shared pieces of ``ledger`` (the usage record, the group commit, the SQL), and choosing a
ledger by URL needs both; here the choice sits above the two, so neither imports the other's
chooser.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from stagelens.reference.ledger import Ledger, SqliteLedger

from stagelens.errors import ConfigurationError

LEDGER_URL_ENV: Final = "STAGELENS_LEDGER_URL"
"""Where the ledger lives when the gateway config names no ``ledger_url``."""


def default_url() -> str:
    """``sqlite:///`` + ``$XDG_STATE_HOME/stagelens/ledger.sqlite3`` (``~/.local/state``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return "sqlite:///" + str(Path(state, "stagelens", "ledger.sqlite3")).lstrip("/")


def resolve_url(configured: str | None) -> str:
    """The ledger URL: the gateway config's, else ``$STAGELENS_LEDGER_URL``, else the
    default SQLite file."""
    return configured or os.environ.get(LEDGER_URL_ENV) or default_url()


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def open_ledger(url: str) -> Ledger:
    """The ledger for ``url`` (nothing is connected yet). ConfigurationError for a scheme
    other than ``sqlite://``, ``postgresql://`` or ``postgres://``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        path = url.split("://", 1)[1]
        if not path.startswith("/"):
            raise ConfigurationError(
                f"ledger URL {redact(url)!r}: the SQLite path must be absolute "
                "(sqlite:///var/lib/stagelens/ledger.sqlite3)"
            )
        return SqliteLedger(Path(path))
    if scheme in ("postgresql", "postgres"):
        from stagelens.reference.ledger_postgres import PostgresLedger

        return PostgresLedger(url)
    raise ConfigurationError(
        f"ledger URL {redact(url)!r}: expected sqlite:///PATH or postgresql://..."
    )
