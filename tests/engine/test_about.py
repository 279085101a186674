"""`tandem --version` and `tandem --paths`: they answer without importing torch,
transformers or Qt, say what is installed, and name the folders without creating them."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import platformdirs

import engine
from engine.about import COMPONENTS, paths_report, version_report
from engine.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_and_paths_run_without_importing_torch_transformers_or_qt():
    code = ("import sys; from engine.cli import main; main(['--version']); main(['--paths']); "
            "print(sorted({'torch', 'transformers', 'PySide6'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, cwd=ROOT)
    assert result.stdout.splitlines()[-1] == "[]"
    assert result.stdout.startswith(f"tandem {engine.__version__}\n")


def test_the_version_report_names_each_component_as_installed():
    lines = version_report().splitlines()
    assert lines[0] == f"tandem {engine.__version__}"
    assert lines[1] == f"Python {sys.version.split()[0]}"
    for name, line in zip(COMPONENTS, lines[2:]):
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = "not installed"
        assert line == f"{name} {expected}"


def test_paths_under_tandem_home_are_named_and_not_created(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("TANDEM_HOME", str(home))
    assert main(["--paths"]) == 0
    printed = capsys.readouterr().out.splitlines()
    folders = {line.split(": ")[0]: line.split(": ", 1)[1].split("  (")[0] for line in printed[:3]}
    assert folders == {"config": str(home / "config"), "data": str(home / "data"), "cache": str(home / "cache")}
    assert str(home) in printed[3]
    assert not home.exists()


def test_without_tandem_home_the_paths_are_the_platform_user_folders(monkeypatch):
    monkeypatch.delenv("TANDEM_HOME", raising=False)
    lines = paths_report().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"config: {platformdirs.user_config_dir('tandem')}  (")
    assert lines[1].startswith(f"data: {platformdirs.user_data_dir('tandem')}  (")
    assert lines[2].startswith(f"cache: {platformdirs.user_cache_dir('tandem')}  (")


def test_help_lists_version_and_paths(capsys):
    try:
        main(["--help"])
    except SystemExit as exit:
        assert exit.code == 0
    shown = capsys.readouterr().out
    assert "--version" in shown and "--paths" in shown
