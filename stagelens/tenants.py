"""Bound the ``tenant`` label: configured tenants (or the first N seen) keep their name.

Why: a label value per API key or per user would make every tenant metric unbounded
(Prometheus naming rules). Tenants outside the allowed set are reported as ``other``.
A tenant is identified by a configured name or a short hash of its key, never the key.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable

from stagelens.semconv import TENANT_OTHER


def key_fingerprint(api_key: str) -> str:
    """A short, stable, non-reversible tenant id for an API key (``key-`` + 8 hex)."""
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:8]


class TenantLimiter:
    """Maps tenant names to bounded label values.

    With ``configured`` names, exactly those keep their name. Without, the first
    ``max_tenants`` distinct names seen are admitted (first come, first kept). The
    ``budgeted`` names keep theirs either way (first come, they hold places among the
    ``max_tenants`` from the start): a tenant with a spend budget folded into ``other`` could
    spend any multiple of it unseen by the cost alerts, which compare each tenant's spend
    with its own budget.
    """

    __slots__ = ("_admitted", "_configured", "_lock", "_max")

    def __init__(
        self, configured: Iterable[str] = (), max_tenants: int = 20, budgeted: Iterable[str] = ()
    ) -> None:
        self._configured = frozenset(configured)
        self._admitted: set[str] = {*self._configured, *budgeted}
        self._max = max_tenants
        self._lock = threading.Lock()

    def label(self, tenant: str | None) -> str:
        """The label value to use for ``tenant``."""
        if not tenant:
            return TENANT_OTHER
        if tenant in self._admitted:
            return tenant
        if self._configured:
            return TENANT_OTHER
        with self._lock:
            if tenant in self._admitted:
                return tenant
            if len(self._admitted) < self._max:
                self._admitted.add(tenant)
                return tenant
        return TENANT_OTHER
