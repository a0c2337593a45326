"""Fixtures for the exporter tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from stagelens.exporters.nvml_sampler import GpuReader


@pytest.fixture(autouse=True)
def _close_gpu_readers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[GpuReader]]:
    """Stop every background sampler a test started, so none outlives it (yields the GPU
    readers made so far)."""
    made: list[GpuReader] = []
    original = GpuReader.__init__

    def init(self: GpuReader, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(GpuReader, "__init__", init)
    yield made
    for reader in made:
        reader.close()
