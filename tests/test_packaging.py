"""The package installs as one `stagelens` namespace with working entry points."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import stagelens


def test_version_comes_from_metadata() -> None:
    """__version__ is the installed distribution's version."""
    assert stagelens.__version__ == importlib.metadata.version("stagelens")


def test_mapped_folders_import_under_the_namespace() -> None:
    """instrumentation/ and exporters/ import as stagelens.* submodules."""
    for name in ("stagelens.instrumentation", "stagelens.exporters", "stagelens.dashboards"):
        assert importlib.util.find_spec(name) is not None, name


def test_no_stray_top_level_copies() -> None:
    """The bare folder names are not importable as a second copy of the code."""
    for name in ("instrumentation", "exporters", "dashboards"):
        assert importlib.util.find_spec(name) is None, name


def test_console_script_is_registered() -> None:
    """The `stagelens` console script points at the CLI."""
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert any(ep.name == "stagelens" and ep.value == "stagelens.cli:main" for ep in scripts)
