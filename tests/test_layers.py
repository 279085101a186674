"""The house rules, checked on every import statement of the source tree:

- engine/ never imports Qt or the app: everything it does runs headless;
- only engine/runtime/ imports llama_cpp, and only engine/runtime/ and the offline tools
  (engine/tools/, which train and export models) import transformers' model classes;
- only the runtimes and the tools ask torch about CUDA;
- the core never imports the offline tools (engine/tools/): they stand above it, and only
  the console command (engine/cli.py), which stands above both, registers them;
- only the server (engine/serve/) imports its web stack (Starlette, uvicorn), and only the
  console command imports the server: the engine runs without them;
- the runtimes and the method table stand below the pair descriptions, the loading and the
  session that use them: they never import engine.config, engine.models or engine.session,
  not even for type hints (they describe what they read as Protocols).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QT_MODULES = ("PySide6", "PyQt5", "PyQt6", "shiboken6")
MODEL_CLASS_MARKERS = ("ForCausalLM", "PreTrainedModel", "AutoModel", "BitsAndBytesConfig")


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in `path`, relative ones resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            found.append((module, [alias.name for alias in node.names]))
    return found


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def in_folder(path: Path, folder: str) -> bool:
    return path.is_relative_to(ROOT / folder)


def violations(rule) -> list[str]:
    return [f"{path.relative_to(ROOT)}: {module} {names}" for path in sources("engine")
            for module, names in imports(path) if rule(path, module, names)]


def test_the_engine_never_imports_qt_or_the_app():
    def breaks(path, module, names):
        return module.split(".")[0] in QT_MODULES or module == "app" or module.startswith("app.")

    assert violations(breaks) == []


def test_only_the_runtimes_import_llama_cpp():
    def breaks(path, module, names):
        return module.split(".")[0] == "llama_cpp" and not in_folder(path, "engine/runtime")

    assert violations(breaks) == []


def test_only_the_runtimes_and_the_tools_import_model_classes():
    def breaks(path, module, names):
        if not module.startswith("transformers") or in_folder(path, "engine/runtime") or in_folder(path, "engine/tools"):
            return False
        return ".models." in module or any(marker in name for name in names for marker in MODEL_CLASS_MARKERS)

    assert violations(breaks) == []


def test_the_core_never_imports_the_offline_tools():
    def breaks(path, module, names):
        above = in_folder(path, "engine/tools") or path == ROOT / "engine" / "cli.py"
        return not above and (module.startswith("engine.tools") or (module == "engine" and "tools" in names))

    assert violations(breaks) == []


WEB_STACK = ("starlette", "uvicorn")


def test_only_the_server_imports_the_web_stack_and_only_the_command_imports_the_server():
    def breaks(path, module, names):
        if in_folder(path, "engine/serve"):
            return False
        server = module.startswith("engine.serve") or (module == "engine" and "serve" in names)
        return module.split(".")[0] in WEB_STACK or (server and path != ROOT / "engine" / "cli.py")

    assert violations(breaks) == []


HIGHER_FLOORS = ("engine.config", "engine.models", "engine.session", "engine.model_files", "engine.pairs")


def test_the_runtimes_and_the_method_table_import_nothing_above_them():
    def breaks(path, module, names):
        below = in_folder(path, "engine/runtime") or path == ROOT / "engine" / "methods.py"
        named = [module] + [f"{module}.{name}" for name in names]
        return below and any(name in HIGHER_FLOORS for name in named)

    assert violations(breaks) == []


def test_only_the_runtimes_and_the_tools_ask_torch_about_cuda():
    """Devices are the runtimes' business (engine/runtime/device.py answers the rest)."""
    offenders = []
    for path in sources("engine"):
        if in_folder(path, "engine/runtime") or in_folder(path, "engine/tools"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name) and node.value.id == "torch":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_a_planted_violation_is_found(tmp_path, monkeypatch):
    """The checks read real import statements: a tree whose engine imports Qt fails them."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "widgets.py").write_text("from PySide6.QtCore import QObject\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    with pytest.raises(AssertionError):
        test_the_engine_never_imports_qt_or_the_app()
