"""The wheel built from this tree is complete and works outside it: installed into a fresh
virtual environment, it holds every module and every file under resources/, and its
`tandem` command prints its version and answers one message with the demo pair. Where it
carries the native kernels' libraries, its tag names this machine's platform, not `any`.

The fresh environment gets the dependencies from this one (already built, offline) through
a .pth file that lists this environment's site-packages folders; path lines in a .pth file
do not run the .pth files inside those folders, so an editable install of the source tree
stays invisible there. Everything runs from a folder outside the checkout.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import engine

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "engine", "resources")
QUESTION = "What is the capital of France? Answer in one sentence."


def files_under(folder: Path) -> set[str]:
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of this tree."""
    work = tmp_path_factory.mktemp("wheel")
    # A copy of what the wheel is built from, so no stale build/ folder of the checkout can leak into it.
    source = work / "source"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", work / "dist", source],
        check=True, cwd=work,
    )
    [wheel] = (work / "dist").glob("tandem-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """A fresh virtual environment with only the wheel installed in it; returns its folder."""
    work = wheel.parent.parent
    environment = work / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    site_packages = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
    ).stdout.strip())
    dependencies = [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]
    (site_packages / "dependencies-from-the-test-environment.pth").write_text("\n".join(dependencies) + "\n")
    # --ignore-installed: this environment's own tandem (an editable install) is visible through
    # the .pth file; pip must neither skip the wheel because of it nor try to remove it.
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel],
        check=True, cwd=work,
    )
    return environment


def run_installed(environment: Path, arguments: list[str], **options) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(arguments, cwd=environment.parent, env=env, capture_output=True, text=True, check=False,
                          timeout=600, **options)


def installed_folder(environment: Path, package: str) -> Path:
    found = run_installed(environment, [environment / "bin" / "python", "-c", f"import {package}; print({package}.__file__)"])
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip()).parent


def test_the_wheel_holds_every_module_and_resource_and_imports_from_the_environment(installed):
    for package in PACKAGES:
        folder = installed_folder(installed, package)
        assert folder.is_relative_to(installed), f"{package} imported from {folder}, not from the wheel"
        assert files_under(folder) == files_under(ROOT / package), package
    assert "drafts/smollm2-135m-draft/heads/heads.safetensors" in files_under(installed_folder(installed, "resources"))
    assert "heads/store.py" in files_under(installed_folder(installed, "engine"))


def native_libraries(wheel: Path) -> dict[str, bytes]:
    """The shared libraries the wheel carries (engine/runtime/_built/), by name: their first bytes."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.open(name).read(20) for name in archive.namelist() if name.endswith(".so")}


def elf_machine(header: bytes) -> tuple[int, int, int]:
    """(word size, byte order, machine) of an ELF file's first 20 bytes: what decides the CPUs
    and systems that can load it."""
    assert header[:4] == b"\x7fELF", f"not an ELF file: {header[:4]!r}"
    byte_order = "little" if header[5] == 1 else "big"
    return header[4], header[5], int.from_bytes(header[18:20], byte_order)


def test_the_wheel_with_native_libraries_is_tagged_for_this_platform(wheel):
    """A wheel tagged py3-none-any would let pip install the x86-64 Linux kernels on any
    machine; a wheel without them (no setup built any) runs anywhere and stays `any`."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = HeaderParser().parsestr(archive.read(f"tandem-{engine.__version__}.dist-info/WHEEL").decode())
    libraries = native_libraries(wheel)
    # Every library of the tree it was built from, in the wheel's root (not under
    # tandem-*.data/purelib/, where a non-pure wheel of a pure build would put them). That tree,
    # not the checkout: test_bundle.py's build rewrites the checkout's libraries meanwhile.
    built = wheel.parent.parent / "source" / "engine" / "runtime" / "_built"
    assert set(libraries) == {f"engine/runtime/_built/{path.name}" for path in built.glob("*.so")}
    if libraries:
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        expected = (f"py3-none-{platform}", "false")
        with Path(sys.executable).resolve().open("rb") as interpreter:  # built for this machine
            this_machine = elf_machine(interpreter.read(20))
        assert {name: elf_machine(header) for name, header in libraries.items()} == dict.fromkeys(libraries, this_machine)
    else:
        expected = ("py3-none-any", "true")
    # pyproject reads the version from engine
    assert wheel.name == f"tandem-{engine.__version__}-{expected[0]}.whl"
    assert (metadata.get_all("Tag"), metadata["Root-Is-Purelib"]) == ([expected[0]], expected[1])


def test_the_wheel_is_almost_all_the_demo_draft(wheel):
    # What packaging/README.md says of it instead of a size in MB, which went stale (51.7 of 67.5).
    with zipfile.ZipFile(wheel) as archive:
        draft = sum(entry.compress_size for entry in archive.infolist() if entry.filename.startswith("resources/drafts/"))
    assert draft >= 0.9 * wheel.stat().st_size


def test_no_readme_writes_the_wheels_size_by_hand():
    for readme in (ROOT / "README.md", ROOT / "packaging" / "README.md"):
        for line in readme.read_text(encoding="utf-8").splitlines():
            if "wheel" in line.lower():
                assert not re.search(r"\d+(\.\d+)? ?MB", line), f"{readme.name}: {line}"


def test_the_installed_command_prints_its_version(installed):
    result = run_installed(installed, [installed / "bin" / "tandem", "--version"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"tandem {engine.__version__}"
    assert any(line.startswith("torch ") and "not installed" not in line for line in lines)


def test_the_installed_command_chats_with_the_demo_pair(installed, demo_target_path):
    result = run_installed(
        installed, [installed / "bin" / "tandem", "chat", "--temperature", "0", "--max-new-tokens", "24"],
        input=QUESTION + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "tandem> " in result.stdout and " tok/s" in result.stdout  # a streamed reply, then its stats line
    # The draft came from the wheel's resources, not from the checkout.
    resources = installed_folder(installed, "resources")
    assert f"Loading draft {resources / 'drafts' / 'smollm2-135m-draft'}" in result.stderr


def test_the_installed_kernel_needs_no_compiler(installed, tmp_path):
    """The wheel carries the native kernels setup built (engine/runtime/_built/): with no C
    compiler and a fresh cache the installed Tandem loads the one of this CPU's variant."""
    from engine.runtime import int8_kernel
    from engine.runtime.kernel_build import PREBUILT_DIR, library_name

    if int8_kernel.unavailable_reason() is not None:
        pytest.skip(f"the int8 kernel does not run here: {int8_kernel.unavailable_reason()}")
    prebuilt = PREBUILT_DIR / library_name(int8_kernel.chosen_variant())
    if not prebuilt.exists():
        pytest.skip(f"no prebuilt kernel for these sources to ship ({prebuilt}): bash packaging/setup.sh builds them")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(CC="no-such-compiler", PATH=str(tmp_path / "no-compilers"), TANDEM_HOME=str(tmp_path / "home"))
    result = subprocess.run(
        [installed / "bin" / "python", "-c", "from engine.runtime import int8_kernel as k; print(k.unavailable_reason()); print(k.library_origin())"],
        cwd=installed.parent, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr
    reason, origin = result.stdout.splitlines()
    assert reason == "None"
    assert origin == f"prebuilt, {installed_folder(installed, 'engine') / 'runtime' / '_built' / prebuilt.name}"

