#!/usr/bin/env bash
# Builds Tandem's desktop bundle with PyInstaller: one folder holding the `tandem` executable
# (no argument opens the app; `tandem chat` etc. run in a terminal), Python, Qt, torch,
# llama.cpp's libraries, the native kernels and the demo pair. Needs the setup's environment (bash
# packaging/setup.sh installs PyInstaller with the dev extra). Nothing is downloaded.
#
#   bash packaging/build_bundle.sh [OUTPUT_DIR]     # default: dist/ -> dist/tandem/tandem
#
# packaging/README.md: why PyInstaller, what the bundle weighs, how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
output=$(realpath -m "${1:-dist}")
# The native kernels of every CPU variant, for the sources as they are (the spec bundles them).
"$PYTHON" -m engine.runtime.kernel_build
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$output" --workpath "$output/.pyinstaller-work" packaging/tandem.spec
rm -rf "$output/.pyinstaller-work"  # the analysis cache: as large as the bundle, not needed after
if [[ $(uname -s) == Linux ]]; then
    cp packaging/linux/tandem.desktop.in packaging/linux/install-desktop-entry.sh "$output/tandem/"
fi
echo "Built $output/tandem ($(du -sh "$output/tandem" | cut -f1)); run $output/tandem/tandem"
