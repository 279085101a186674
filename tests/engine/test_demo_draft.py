"""The draft shipped in resources/: intact, small enough, and a valid partner of the demo target."""
from __future__ import annotations

import hashlib
from pathlib import Path

from engine.compat import check_pair_compatible
from engine.config import DEMO_DRAFT_FOLDER, ModelSpec, demo_pair
from engine.drafters.backoff_ngram import TABLE_FILE, NgramCounts
from engine.models import load_model, load_tokenizer_only

SIZE_LIMIT_MB = 40


def recorded_checksums(folder: Path = DEMO_DRAFT_FOLDER) -> dict[str, str]:
    """File name -> SHA-256, as a shipped folder's SHA256SUMS records them."""
    lines = (folder / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())}


def test_the_shipped_files_match_their_recorded_checksums():
    checksums = recorded_checksums()
    assert {"model.safetensors", "config.json", TABLE_FILE} <= set(checksums)
    for name, digest in checksums.items():
        assert hashlib.sha256((DEMO_DRAFT_FOLDER / name).read_bytes()).hexdigest() == digest, name


def test_the_shipped_draft_is_small_enough_to_ship():
    assert (DEMO_DRAFT_FOLDER / "model.safetensors").stat().st_size <= SIZE_LIMIT_MB * 2**20


def test_the_shipped_draft_loads_and_pairs_with_the_demo_target(demo_target_folder):
    assert demo_pair().draft.source == str(DEMO_DRAFT_FOLDER)
    draft = load_model(ModelSpec(str(DEMO_DRAFT_FOLDER), precision="fp32", device="cpu"), runtime="torch")
    check_pair_compatible(load_tokenizer_only(ModelSpec(str(demo_target_folder))), draft.tokenizer)
    # every token id the tokenizer can produce has a row: the draft's own, or the shared one of
    # a reduced vocabulary (which then maps the whole tokenizer)
    model_ids = draft.model.config.vocab_size if draft.vocabulary is None else draft.vocabulary.full_size
    assert model_ids >= len(draft.tokenizer)
    assert NgramCounts.load(DEMO_DRAFT_FOLDER / TABLE_FILE).after, "the second-stage table is empty"


def test_the_shipped_gguf_export_runs_on_llamacpp_like_the_safetensors():
    import pytest
    import torch

    pytest.importorskip("llama_cpp")
    assert "model.q8_0.gguf" in recorded_checksums()
    on_llamacpp = load_model(ModelSpec(str(DEMO_DRAFT_FOLDER)), as_draft=True, runtime="llama.cpp")
    on_torch = load_model(ModelSpec(str(DEMO_DRAFT_FOLDER), precision="fp32", device="cpu"), runtime="torch")
    assert on_llamacpp.runtime == "llama.cpp"
    # Enough positions that a couple of near-ties (Q8_0 flips those) cannot decide the test.
    passage = (
        "The capital of France is Paris, and the capital of Italy is Rome. Both cities are famous for "
        "their museums, their food and their long history. Paris grew along the river Seine, where the "
        "cathedral of Notre-Dame stands on an island. Rome was built on seven hills beside the Tiber, and "
        "its ruins still show how the empire lived. Visitors walk, eat and look for days in either city."
    )
    ids = on_torch.tokenizer(passage)["input_ids"]
    assert len(ids) >= 80
    llamacpp_logits = on_llamacpp.open_runtime().forward(ids, logits_wanted=len(ids))
    torch_logits = on_torch.open_runtime().forward(ids, logits_wanted=len(ids))
    # Q8_0 weights round a little; the draft's first choices must stay the same.
    agree = (llamacpp_logits.argmax(-1) == torch_logits.argmax(-1)).float().mean()
    assert agree >= 0.9, agree
    on_llamacpp.close()
