"""Bound the ``model`` label to served models.

Why: the model name comes from the request body, which the client writes. Labelled as
sent, every typo or made-up name would become new series of every model metric, without
bound (Prometheus naming rules). A name only gets its own label value once the engine has
answered a request for it successfully (an engine refuses a model it does not serve), or
when it is configured; at most ``max_models`` are admitted. Everything else is ``other``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from stagelens.semconv import MODEL_OTHER


class ModelLabels:
    """Maps requested model names to bounded ``model`` label values.

    With ``configured`` names, exactly those (and ``default``) keep their name. Without,
    the first ``max_models`` distinct names that were served successfully are admitted
    (first come, first kept); a name is never admitted by a failed request.
    """

    __slots__ = ("_admitted", "_lock", "_room")

    def __init__(
        self, configured: Iterable[str] = (), max_models: int = 20, *, default: str
    ) -> None:
        names = frozenset(configured)
        self._admitted = names | {default}
        """Replaced on admission, never mutated: read without the lock."""
        self._room = 0 if names else max_models
        self._lock = threading.Lock()

    def label(self, model: str, *, served: bool) -> str:
        """The label value for a request for ``model``; ``served``: it was answered
        successfully (status below 400)."""
        if model in self._admitted:
            return model
        if not served or self._room <= 0:
            return MODEL_OTHER
        with self._lock:
            if model not in self._admitted and self._room > 0:
                self._admitted = self._admitted | {model}
                self._room -= 1
        return model if model in self._admitted else MODEL_OTHER
