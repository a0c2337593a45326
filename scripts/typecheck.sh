#!/usr/bin/env bash
# mypy --strict over the stagelens namespace as it is installed: the top-level folders
# instrumentation/, exporters/, dashboards/ are mapped into stagelens.* by setuptools, which
# mypy cannot follow through the editable-install finder, so we check a symlinked view.
set -euo pipefail
cd "$(dirname "$0")/.."
view=.cache/typecheck
rm -rf "$view"; mkdir -p "$view/stagelens"
for f in stagelens/*; do ln -s "$PWD/$f" "$view/stagelens/$(basename "$f")"; done
for d in instrumentation exporters dashboards; do ln -s "$PWD/$d" "$view/stagelens/$d"; done
ln -s "$PWD/examples/gateway_vllm" "$view/stagelens/reference"
cd "$view" && exec ../../.venv/bin/mypy --config-file ../../pyproject.toml -p stagelens
