"""The installed distribution's version, in a module of its own so that core modules can
name it without importing the package facade (``stagelens/__init__.py``), which imports
the instrumentation and exporters layers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stagelens")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
