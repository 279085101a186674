"""`tandem distill` end to end on a tiny random target: the draft loads, learns, resumes, and
is compatible with its target. Each run takes a few seconds."""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.compat import check_pair_compatible
from engine.chat_prompt import Message
from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.events import Finished
from engine.tools.distill import command, data
from engine.tools.distill.command import add_distill_command
from engine.tools.distill.pipeline import Distillation, Progress
from engine.tools.distill.train import CHECKPOINT_NAME
from engine.models import load_model, load_tokenizer_only
from tests.engine.tiny_models import tiny_llama

WORDS = [f"w{i}" for i in range(60)]  # with 4 special tokens: a 64-token vocabulary
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s>{% endif %}"
)
# Small enough for seconds, large enough for several epochs of many steps.
RUN_ARGUMENTS = ["--size", "tiny", "--tokens", "2000", "--max-new-tokens", "16", "--epochs", "6", "--device", "cpu"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # On a busy 2-core machine, two threads spin-wait for each other on every tiny matmul:
    # one thread runs these models ~50× faster.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, make_word_tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("distill-target")
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE)
    tiny_llama(seed=5, vocab_size=len(tokenizer), layers=2, hidden=128).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    rng = random.Random(0)
    lines = [json.dumps({"prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 6)))}) for _ in range(40)]
    path = tmp_path_factory.mktemp("distill-prompts") / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def distill(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_distill_command(parser.add_subparsers())
    args = parser.parse_args(["distill", *argv])
    return args.run(args)


def start_arguments(target: Path, out: Path, prompts: Path) -> list[str]:
    return ["--target", str(target), "--out", str(out), "--prompts", str(prompts), *RUN_ARGUMENTS]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def greedy_reply(pair, method: str) -> tuple[int, ...]:
    pair.reset_caches()
    settings = DecodeSettings(method=method, max_new_tokens=20, tree_shape="12x4")
    events = list(pair.generate([Message("user", "w1 w2 w3")], settings))
    return next(event for event in events if isinstance(event, Finished)).token_ids


@pytest.fixture(scope="module")
def finished_run(tiny_target, prompts_file, tmp_path_factory) -> Path:
    """A run from start to end in one go."""
    out = tmp_path_factory.mktemp("distill-run") / "draft"
    assert distill(*start_arguments(tiny_target, out, prompts_file)) == 0
    return out


def test_a_tiny_run_yields_a_loadable_draft_that_learned(finished_run, tiny_target):
    out = finished_run
    report = json.loads((out / "report.json").read_text())
    assert report["heldout_kl"] < 0.8 * report["heldout_kl_initial"]
    assert report["heldout_agreement"] > report["heldout_agreement_initial"]
    assert report["training_tokens"] >= 2000
    draft = load_model(ModelSpec(str(out), precision="fp32", device="cpu"), runtime="torch")
    target = load_model(ModelSpec(str(tiny_target), precision="fp32", device="cpu"), runtime="torch")
    assert draft.model.config.vocab_size == target.model.config.vocab_size
    check_pair_compatible(target.tokenizer, draft.tokenizer)
    check_pair_compatible(load_tokenizer_only(ModelSpec(str(tiny_target))), load_tokenizer_only(ModelSpec(str(out))))


def test_an_interrupted_run_resumes_from_its_checkpoint(tiny_target, prompts_file, tmp_path, monkeypatch, finished_run):
    out = tmp_path / "draft"
    checkpoint = out / "distill-work" / CHECKPOINT_NAME

    # 1. pause at a step limit
    assert distill(*start_arguments(tiny_target, out, prompts_file), "--stop-after-steps", "3") == 0
    assert torch.load(checkpoint, weights_only=True)["step"] == 3
    assert not (out / "config.json").exists()
    with pytest.raises(ConfigError, match="--resume"):
        distill(*start_arguments(tiny_target, out, prompts_file))  # the folder is taken
    with pytest.raises(ConfigError, match="--tokens"):
        distill("--out", str(out), "--resume", "--tokens", "5000")  # a resumed run keeps its settings

    # 2. Ctrl-C during step 5: the run finishes that step, saves, and exits with 130
    original_update = command._Bars.update

    def interrupt_at_step_5(bars, progress: Progress) -> None:
        original_update(bars, progress)
        if progress.phase == "training" and progress.done == 5:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(command._Bars, "update", interrupt_at_step_5)
    assert distill("--out", str(out), "--resume") == command.INTERRUPTED_EXIT_CODE
    monkeypatch.undo()
    interrupted = torch.load(checkpoint, weights_only=True)
    assert interrupted["step"] == 5
    assert interrupted["examples_seen"] == 5 * 16

    # 3. resume to the end: the step counter continues from 5
    steps_seen: list[int] = []

    def record(progress: Progress) -> None:
        if progress.phase == "training":
            steps_seen.append(progress.done)

    outcome = Distillation.resume(out, "cpu").run(progress=record)
    assert outcome.status == "finished"
    assert steps_seen[0] == 5 and steps_seen[1] == 6
    assert outcome.step == outcome.total_steps == steps_seen[-1]
    final = weights(out)
    embedding = "model.embed_tokens.weight"
    assert not torch.equal(final[embedding], interrupted["model"][embedding])
    # Batches follow from the step number and the optimizer state is restored, so the
    # interruptions changed nothing: the draft is the one an uninterrupted run trains.
    uninterrupted = weights(finished_run)
    assert all(torch.equal(final[name], uninterrupted[name]) for name in final)


def test_data_generation_resumes_with_the_same_replies(tiny_target, prompts_file, tmp_path, finished_run, monkeypatch):
    monkeypatch.setattr(data, "SHARD_SEQUENCES", 16)
    out = tmp_path / "draft"
    assert distill(*start_arguments(tiny_target, out, prompts_file), "--stop-after-steps", "0") == 0
    work = out / "distill-work"
    shards = sorted(work.glob("train-*.pt"))
    assert len(shards) > 3
    kept = {sequence.key for shard in shards[:2] for sequence in data.load_shard(shard)}
    (work / "data-done.json").unlink()
    for shard in shards[2:]:
        shard.unlink()  # as if stopped while writing the third shard

    # Stopped again after the first new batch of replies: the finished ones are kept.
    written: list[int] = []

    def count(progress: Progress) -> None:
        if progress.phase == "training data":
            written.append(progress.done)

    stopped = Distillation.resume(out, "cpu").run(lambda: len(written) > 3, count)
    assert stopped.status == "stopped"
    assert 2 < len(list(work.glob("train-*.pt"))) < len(shards)
    assert Distillation.resume(out, "cpu").run(max_steps=0).status == "paused"

    # Every reply is written once, and a reply's key decides it: the resumed run wrote the
    # same replies as the uninterrupted one, whatever batches they shared.
    resumed = {sequence.key: sequence for sequence in data.load_split(work, "train")}
    original = {sequence.key: sequence for sequence in data.load_split(finished_run / "distill-work", "train")}
    assert len(resumed) == sum(1 for _ in data.load_split(work, "train"))
    assert kept <= set(resumed)
    shared = set(resumed) & set(original)
    assert len(shared) > 0.9 * len(original)
    for key in shared:
        assert torch.equal(resumed[key].token_ids, original[key].token_ids)
        torch.testing.assert_close(resumed[key].top_logprobs, original[key].top_logprobs, atol=1e-2, rtol=0)


def test_resume_needs_a_run_to_resume(tmp_path):
    with pytest.raises(ConfigError, match="nothing to resume"):
        distill("--out", str(tmp_path / "empty"), "--resume")


def test_the_ngram_table_is_built_from_the_draft_and_found_by_the_pair(finished_run, tiny_target, prompts_file):
    """`tandem ngram-table` counts the draft's own replies into its folder; a pair with that
    draft loads the table as the second stage's background and decodes `staged` exactly."""
    from engine.cli import main
    from engine.drafters.backoff_ngram import TABLE_FILE
    from engine.session import load_pair

    assert main(["ngram-table", "--draft", str(finished_run), "--tokens", "400", "--prompts", str(prompts_file), "--device", "cpu"]) == 0
    assert (finished_run / TABLE_FILE).is_file()
    pair = load_pair(PairConfig("tiny", ModelSpec(str(tiny_target), "fp32", "cpu"), ModelSpec(str(finished_run), "fp32", "cpu")))
    assert pair.ngram_model.background.after, "the pair did not load the draft's table"
    assert set(pair.methods) == {"auto", "ar", "chain", "ngram", "tree", "staged"}

    reference = greedy_reply(pair, "ar")
    for method in ("staged", "tree", "ngram"):
        assert greedy_reply(pair, method) == reference, method


def test_a_reduced_vocabulary_draft_is_trained_saved_and_decodes_exactly(tiny_target, prompts_file, tmp_path):
    """--vocabulary keeps the tokens the target writes most: the draft's embedding and output
    layer shrink to them plus one shared row, the folder says which they are, and a pair
    with that draft (its n-gram table too) still decodes exactly what the target alone does."""
    from engine.cli import main
    from engine.runtime.reduced_vocabulary import VOCABULARY_FILE
    from engine.session import load_pair

    out = tmp_path / "reduced"
    assert distill(*start_arguments(tiny_target, out, prompts_file), "--vocabulary", "24") == 0
    report = json.loads((out / "report.json").read_text())
    kept = json.loads((out / VOCABULARY_FILE).read_text())["kept_ids"]
    assert len(kept) >= 24 and report["vocabulary"] == len(kept) + 1
    assert 0 < report["heldout_coverage"]["first_choice"] <= 1
    assert weights(out)["model.embed_tokens.weight"].shape[0] == len(kept) + 1
    assert report["heldout_agreement"] > report["heldout_agreement_initial"]

    assert main(["ngram-table", "--draft", str(out), "--tokens", "300", "--prompts", str(prompts_file), "--device", "cpu"]) == 0
    pair = load_pair(PairConfig("tiny", ModelSpec(str(tiny_target), "fp32", "cpu"), ModelSpec(str(out), "fp32", "cpu")))
    assert pair.draft.vocabulary is not None and len(pair.draft.vocabulary.kept_ids) == len(kept)
    table_tokens = {token for history in pair.ngram_model.background.after.values() for token in history}
    assert table_tokens <= set(kept), "the draft's replies hold only tokens it keeps, in the tokenizer's ids"

    reference = greedy_reply(pair, "ar")
    for method in ("chain", "tree", "staged"):
        assert greedy_reply(pair, method) == reference, method


def test_a_prefix_draft_is_cut_from_the_target_trained_and_decodes_exactly(tiny_target, prompts_file, tmp_path):
    """--size prefix keeps the target's first --layers layers at its width and trains on from
    its weights; the result is a draft like any other: it loads, and a pair decodes exactly."""
    from engine.session import load_pair

    out = tmp_path / "prefix"
    arguments = start_arguments(tiny_target, out, prompts_file)
    arguments[arguments.index("tiny")] = "prefix"
    assert distill(*arguments, "--layers", "1", "--learning-rate", "0.001") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["shape"]["layers"] == 1 and report["shape"]["hidden_size"] == 128  # the target's width
    assert report["heldout_kl"] < report["heldout_kl_initial"]
    target_layer = load_model(ModelSpec(str(tiny_target), "fp32", "cpu"), runtime="torch").model.model.layers[0]
    draft_layer = load_model(ModelSpec(str(out), "fp32", "cpu"), runtime="torch").model.model.layers[0]
    moved = draft_layer.mlp.up_proj.weight - target_layer.mlp.up_proj.weight
    assert 0 < moved.abs().max() < target_layer.mlp.up_proj.weight.abs().max(), "trained on from the target's layer"

    pair = load_pair(PairConfig("tiny", ModelSpec(str(tiny_target), "fp32", "cpu"), ModelSpec(str(out), "fp32", "cpu")))
    reference = greedy_reply(pair, "ar")
    for method in ("chain", "tree"):
        assert greedy_reply(pair, method) == reference, method


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "2"], "1 to 1 of the target's layers"),  # the tiny target has 2: a prefix must leave one out
        (["--size", "tiny", "--layers", "1"], "--layers is for --size prefix"),
    ],
)
def test_a_prefix_that_cannot_be_cut_is_refused_before_the_run_starts(tiny_target, prompts_file, tmp_path, extra, message):
    out = tmp_path / "refused"
    arguments = start_arguments(tiny_target, out, prompts_file)
    arguments[arguments.index("tiny")] = "prefix"
    with pytest.raises(ConfigError, match=message):
        distill(*arguments, *extra)
    assert not out.exists(), "nothing claimed: the same folder can be used for the corrected command"


# --- EAGLE-3 heads -------------------------------------------------------------------------

EAGLE_ARGUMENTS = ["--kind", "eagle3", "--tokens", "3000", "--max-new-tokens", "16", "--epochs", "10", "--vocabulary", "48", "--device", "cpu"]


@pytest.fixture(scope="module")
def six_layer_target(tmp_path_factory, make_word_tokenizer) -> Path:
    """Deep enough for EAGLE-3's low, middle and high feature layers (2, 3, 3)."""
    folder = tmp_path_factory.mktemp("eagle-target")
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE)
    tiny_llama(seed=6, vocab_size=len(tokenizer), layers=6, hidden=64).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def eagle_run(six_layer_target, prompts_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eagle-run") / "head"
    arguments = ["--target", str(six_layer_target), "--out", str(out), "--prompts", str(prompts_file), *EAGLE_ARGUMENTS]
    assert distill(*arguments) == 0
    return out


def test_an_eagle3_run_learns_the_target_and_drafts_exactly_with_it(eagle_run, six_layer_target):
    from engine.runtime.eagle3_head import load_head
    from engine.session import load_pair

    report = json.loads((eagle_run / "report.json").read_text())
    assert report["kind"] == "eagle3" and report["ttt_steps"] == 3 and len(report["heldout"]) == 3
    first, later = report["heldout"][0], report["heldout"][1]
    assert first["agreement"] > report["heldout_initial"][0]["agreement"] + 0.1, report
    assert later["agreement"] > report["heldout_initial"][1]["agreement"], report
    head = load_head(eagle_run)  # the public layout, readable as it was written
    assert head.config.draft_vocab_size <= 48 and head.config.layer_ids == (2, 3, 3)
    pair = load_pair(PairConfig("tiny", ModelSpec(str(six_layer_target), precision="fp32", device="cpu"), runtime="torch", eagle=str(eagle_run)))
    pair.stop_token_ids = frozenset()
    expected = greedy_reply(pair, "ar")
    for method in ("eagle", "eagle-tree"):
        assert greedy_reply(pair, method) == expected, method
    pair.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_eagle3_run_on_a_gpu_writes_records_and_trains_there(six_layer_target, prompts_file, tmp_path):
    # On a GPU each phase runs on the device: batched torch replies with the draws made
    # there, the features from the torch target, training in bf16.
    out = tmp_path / "head"
    on_gpu = [*EAGLE_ARGUMENTS[:-1], "cuda"]
    assert distill("--target", str(six_layer_target), "--out", str(out), "--prompts", str(prompts_file), *on_gpu) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["heldout"][0]["agreement"] > report["heldout_initial"][0]["agreement"] + 0.1, report
    assert report["training_reply_tokens"] >= 3000


def test_an_interrupted_eagle3_run_resumes_to_the_same_head(eagle_run, six_layer_target, prompts_file, tmp_path):
    out = tmp_path / "head"
    arguments = ["--target", str(six_layer_target), "--out", str(out), "--prompts", str(prompts_file), *EAGLE_ARGUMENTS]
    assert distill(*arguments, "--stop-after-steps", "4") == 0
    assert not (out / "config.json").exists()
    assert distill("--out", str(out), "--resume") == 0
    resumed, whole = load_file(out / "model.safetensors"), load_file(eagle_run / "model.safetensors")
    assert resumed.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], msg=name)
