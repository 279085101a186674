"""The one table of decoding methods: what each is called, what it needs, whether its replies
are exact, and the drafter and verifier its rounds use (engine/round.py).

Config validation, the session, the bench, the CLI, the terminal chat and every label of the
app read this table; adding a method is a drafter (or verifier) module and one row here.
This module imports nothing heavy: the CLI's --help and the app's first window read it
before torch is loaded; a row's parts are built only when a reply asks for them.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .drafters.base import Drafter
    from .round import Verifier

# What a method's drafting needs of a pair, beyond a target.
DRAFT_MODEL = "a draft model"
TREES = "token trees"  # both runtimes run branches (no sliding-window attention)
HEADS = "calibrated heads"  # SPRINTER's verifier and SpecDec++'s acceptance head on the draft
EAGLE_HEAD = "an EAGLE-3 head"  # a head that drafts from the target's own features


# What the builders below read of a loaded pair and of the decoding settings. They are
# described here rather than imported, so the table sits below the session and the config
# that read it (engine/session.py's LoadedPair and engine/config.py's DecodeSettings fit them).


class NgramLimits(Protocol):
    max_ngram: int
    min_ngram: int


class PairConfigParts(Protocol):
    ngram: NgramLimits


class DraftSettings(Protocol):
    verifier: str
    draft_tokens: int
    adaptive_max_tokens: int
    adaptive_stop_threshold: float
    sprinter_max_unchecked: int


class PairParts(Protocol):
    config: PairConfigParts
    vocab_size: int
    draft_runner: Any  # a runtime.base.ModelRunner, or None for a target-only pair
    eagle_runner: Any
    ngram_model: Any
    heads: Any
    speed_record: Any
    methods: tuple[str, ...]

    def tree_policy(self, settings: DraftSettings, method_name: str) -> Any: ...

    def chain_length(self, drafter_name: str, most: int) -> Any: ...


# Which setting shapes a method's rounds, for the app's knobs and the reply line.
KNOB_NONE, KNOB_DRAFT_TOKENS, KNOB_TREE_SHAPE, KNOB_ADAPTIVE, KNOB_UNCHECKED = (
    "none", "draft_tokens", "tree_shape", "adaptive_max_tokens", "sprinter_max_unchecked",
)


@dataclass(frozen=True)
class Method:
    name: str
    title: str  # what menus call it
    summary: str  # one line: what a round does
    drafter: Callable[[PairParts, DraftSettings], Drafter]
    exact: bool = True  # replies follow the target's own distribution (token for token when greedy)
    needs: tuple[str, ...] = ()
    knob: str = KNOB_NONE
    approximate_verifier: bool = False  # SPRINTER's gate in place of exact verification

    def verifier(self, settings: DraftSettings) -> Verifier:
        from .verifying.exact import exact_verifier

        exact = exact_verifier(settings.verifier)
        if not self.approximate_verifier:
            return exact
        from .verifying.sprinter import sprinter_verifier

        return sprinter_verifier(exact)

    @property
    def drafts_with_model(self) -> bool:
        return DRAFT_MODEL in self.needs


# The drafters, built per reply from the pair's loaded parts.


def _nothing(pair: PairParts, settings: DraftSettings) -> Drafter:
    from .drafters.base import NoDrafter

    return NoDrafter()


def _chain(pair: PairParts, settings: DraftSettings) -> Drafter:
    """The draft model's chain; prompt lookup for a pair without a draft model."""
    if pair.draft_runner is None:
        from .drafters.ngram import NgramDrafter

        return NgramDrafter(settings.draft_tokens, pair.config.ngram.max_ngram, pair.config.ngram.min_ngram)
    from .drafters.model_drafter import ModelDrafter

    return ModelDrafter(pair.draft_runner, pair.vocab_size, settings.draft_tokens,
                        length=pair.chain_length("chain", settings.draft_tokens))


def _backoff_ngram(pair: PairParts, settings: DraftSettings) -> Drafter:
    from .drafters.backoff_ngram import BackoffNgramDrafter

    return BackoffNgramDrafter(pair.ngram_model, settings.draft_tokens)


def _tree(name: str, second_stage: bool) -> Callable[[PairParts, DraftSettings], Drafter]:
    def build(pair: PairParts, settings: DraftSettings) -> Drafter:
        from .drafters.tree_drafter import TreeDrafter

        policy = pair.tree_policy(settings, name)
        return TreeDrafter(pair.draft_runner, pair.vocab_size, policy, pair.ngram_model if second_stage else None)

    return build


def _eagle_chain(pair: PairParts, settings: DraftSettings) -> Drafter:
    from .drafters.model_drafter import ModelDrafter

    return ModelDrafter(pair.eagle_runner, pair.vocab_size, settings.draft_tokens,
                        length=pair.chain_length("eagle", settings.draft_tokens))


def _eagle_tree(pair: PairParts, settings: DraftSettings) -> Drafter:
    """EAGLE-2's dynamic tree: the tree drafter's best-first growth by cumulative draft
    log-probability, over the head."""
    from .drafters.tree_drafter import TreeDrafter

    return TreeDrafter(pair.eagle_runner, pair.vocab_size, pair.tree_policy(settings, "eagle-tree"))


def _auto(pair: PairParts, settings: DraftSettings) -> Drafter:
    """The fastest of plain decoding and the pair's cheap exact drafters, as measured here."""
    from .drafters.auto import MethodChooser

    from .drafters.model_drafter import ModelDrafter

    candidates = {"ar": _nothing(pair, settings)}  # in trial order: untried ones run in it
    curve = pair.chain_length("chain", settings.draft_tokens)  # the pair's verify costs, as measured
    for name in trial_order(curve.verify_cost):
        if name not in pair.methods:
            continue
        if name in AUTO_CHAINS:
            runner = pair.eagle_runner if name == "eagle" else pair.draft_runner
            if runner is not None:  # (a pair without a draft model chains by prompt lookup)
                candidates[name] = ModelDrafter(runner, pair.vocab_size, settings.draft_tokens,
                                                length=pair.chain_length(name, settings.draft_tokens))
        else:
            candidates[name] = BY_NAME[name].drafter(pair, settings)
    return MethodChooser(candidates, pair.speed_record)


def _adaptive(pair: PairParts, settings: DraftSettings) -> Drafter:
    from .drafters.adaptive import AdaptiveLength
    from .drafters.model_drafter import ModelDrafter

    heads, threshold = pair.heads, settings.adaptive_stop_threshold
    return ModelDrafter(
        pair.draft_runner, pair.vocab_size, settings.adaptive_max_tokens, lambda sampler: AdaptiveLength(heads, sampler, threshold)
    )


def _sprinter(pair: PairParts, settings: DraftSettings) -> Drafter:
    from .drafters.model_drafter import ModelDrafter
    from .verifying.sprinter import SprinterGate

    heads = pair.heads
    return ModelDrafter(pair.draft_runner, pair.vocab_size, settings.sprinter_max_unchecked, lambda sampler: SprinterGate(heads, sampler))


TABLE = (
    Method(
        "auto", "auto", "picks, round by round, whichever exact method has written tokens soonest on this machine "
        "(plain decoding included), from what its rounds have cost here", _auto,
    ),
    Method("ar", "ar", "plain decoding, one target call per token (the reference)", _nothing),
    Method(
        "chain", "chain", "the draft proposes up to K tokens, as many as pay here, the target verifies them in one call", _chain,
        knob=KNOB_DRAFT_TOKENS,
    ),
    Method(
        "tree", "tree", "the draft proposes a tree of alternatives, the target verifies all of it in one call",
        _tree("tree", second_stage=False), needs=(DRAFT_MODEL, TREES), knob=KNOB_TREE_SHAPE,
    ),
    Method(
        "staged", "staged", "a tree whose draft model checks an n-gram model's proposals first (a second drafting stage)",
        _tree("staged", second_stage=True), needs=(DRAFT_MODEL, TREES), knob=KNOB_TREE_SHAPE,
    ),
    Method("ngram", "ngram", "an n-gram model of the conversation drafts K tokens, no draft model", _backoff_ngram, knob=KNOB_DRAFT_TOKENS),
    Method(
        "eagle", "EAGLE-3 chain",
        "an EAGLE-3 head drafts up to K tokens from the target's own features, as many as pay here; one target call verifies them",
        _eagle_chain, needs=(EAGLE_HEAD,), knob=KNOB_DRAFT_TOKENS,
    ),
    Method(
        "eagle-tree", "EAGLE-3 tree",
        "an EAGLE-3 head grows a tree of likely continuations (EAGLE-2's dynamic tree); one target call verifies all of it",
        _eagle_tree, needs=(EAGLE_HEAD, TREES), knob=KNOB_TREE_SHAPE,
    ),
    Method(
        "adaptive", "adaptive chain (SpecDec++)",
        "the draft proposes until a learned head expects a rejection; verified exactly",
        _adaptive, needs=(DRAFT_MODEL, HEADS), knob=KNOB_ADAPTIVE,
    ),
    Method(
        "sprinter", "SPRINTER",
        "the target runs only when a learned verifier flags a drafted token; tokens it passes go out unchecked",
        _sprinter, exact=False, needs=(DRAFT_MODEL, HEADS), knob=KNOB_UNCHECKED, approximate_verifier=True,
    ),
)
BY_NAME = {method.name: method for method in TABLE}
# What `auto` chooses among besides plain decoding, where the pair offers them: the methods
# that can beat it (n-gram chains rarely do). Its chains, like `chain`'s and `eagle`'s, are as
# long as measured to pay here, up to K (drafters/chain_length.py): on the 2-core CPU chains of
# 1-2 tokens beat plain decoding where chains of 4 did not.
AUTO_CANDIDATES = ("eagle-tree", "eagle", "tree", "staged", "chain")
AUTO_CHAINS = ("eagle", "chain")
# The order `auto` tries its candidates in, from a fresh start. Its trials may lose only 1% of
# the decoding time, so on a slow target the first candidates tried are the only ones tried for
# a while. Where a verify of 8 tokens costs little more than one (a GPU) a tree checks more
# guesses for a round's price: trees first, as AUTO_CANDIDATES lists them. Where it costs more
# (a CPU) chains, whose length follows that cost, go first. On a 2-core Zen 5, from a fresh
# start: on a 1.7B shape at 4 bits (synthetic acceptance 0.6 ... 0.13), trees first, `auto`
# tried `tree` once in 144 tokens, never reached `chain` (1.62x plain decoding that run) and
# wrote 0.99x; chains first, 1.10x. On the demo pair's six kinds of task, 0.97x (0.94-0.99x
# by kind) trees first, 1.00x (0.98-1.03x) chains first (docs/BENCHMARKS.md).
CHAINS_FIRST = ("eagle", "chain", "eagle-tree", "staged", "tree")
WIDE_VERIFY_CHEAP = 1.2  # verify(8) / verify(1) at or under which trees go first


def trial_order(verify_cost: Callable[[int], float | None]) -> tuple[str, ...]:
    """AUTO_CANDIDATES in the order `auto` tries them, given the pair's measured verify costs
    (seconds for a number of tokens; None before any was measured: the listed order)."""
    one, eight = verify_cost(1), verify_cost(8)
    if one is None or eight is None or eight <= WIDE_VERIFY_CHEAP * one:
        return AUTO_CANDIDATES
    return CHAINS_FIRST
NAMES = tuple(BY_NAME)
EXACT_NAMES = tuple(method.name for method in TABLE if method.exact)
APPROXIMATE_NAMES = tuple(method.name for method in TABLE if not method.exact)


def method(name: str) -> Method:
    """The row of `name`; a ValueError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(NAMES)}") from None


def label(name: str) -> str:
    """What reply lines and figures call a method: its title, marked when it is approximate
    (a name from an older version stays as it is)."""
    if name not in BY_NAME:
        return name
    row = BY_NAME[name]
    return row.title if row.exact else f"{row.title} (approximate)"


def is_exact(name: str) -> bool:
    return name not in APPROXIMATE_NAMES


# The verifier switch (exact | SPRINTER) as users see it: SPRINTER replaces the exact method.

EXACT_MODE, SPRINTER_MODE = "exact", "sprinter"
VERIFIER_MODES = (EXACT_MODE, SPRINTER_MODE)


def method_for_mode(exact_method: str, verifier_mode: str) -> str:
    """The method replies use: the chosen exact method, or SPRINTER when the switch says so."""
    if verifier_mode not in VERIFIER_MODES:
        raise ValueError(f"unknown verifier {verifier_mode!r}: choose exact or sprinter")
    return SPRINTER_MODE if verifier_mode == SPRINTER_MODE else exact_method


def mode_of(method_name: str) -> str:
    return EXACT_MODE if is_exact(method_name) else SPRINTER_MODE


def default_method(offered: tuple[str, ...] | list[str]) -> str:
    """What a pair decodes with unless the user chose otherwise: `auto`, the fastest exact
    method measured on this machine (plain decoding where drafting does not pay)."""
    return next((name for name in ("auto", "chain") if name in offered), "ar")


def offered_by(pair: Any) -> tuple[str, ...]:
    """The methods `pair` (a PairParts, or anything with `has_draft_model`, `supports_trees`
    and `has_heads`) can decode with."""
    return tuple(row.name for row in TABLE if not missing_needs(row, pair))


def missing_needs(row: Method, pair: Any) -> list[str]:
    present = {DRAFT_MODEL: pair.has_draft_model, TREES: pair.supports_trees, HEADS: pair.has_heads, EAGLE_HEAD: pair.has_eagle_head}
    return [need for need in row.needs if not present[need]]


def refusal(pair: Any, name: str, pair_name: str, heads_problem: str | None = None) -> str | None:
    """Why `pair` cannot decode with `name`, and what to do about it; None when it can."""
    if name not in BY_NAME:
        return f"The pair {pair_name!r} cannot decode with {name!r}: there is no such method ({', '.join(NAMES)})."
    missing = missing_needs(BY_NAME[name], pair)
    if not missing:
        return None
    if DRAFT_MODEL in missing:
        return f"The pair {pair_name!r} cannot decode with {name!r}: it needs a draft model, and this pair has none."
    if EAGLE_HEAD in missing:
        return (f"The pair {pair_name!r} cannot decode with {name!r}: it needs an EAGLE-3 head for its target. "
                "Add one to the pair (a folder or Hugging Face repo id), or train one: tandem distill --kind eagle3")
    if HEADS in missing:
        why = (heads_problem or "its draft has no calibrated heads yet.").rstrip(".")
        return (f"The pair {pair_name!r} cannot decode with {name!r}: {why}. "
                f"Calibrate them in Settings, or run: tandem calibrate --pair {shlex.quote(pair_name)}")
    return (f"The pair {pair_name!r} cannot decode with {name!r}: token trees need full attention in "
            "every layer, and its models use sliding-window attention.")


# What `tandem bench` sets beside the engine's methods: other programs' ways of running the
# same weights, the numbers a user compares with.
BENCH_PEERS = {
    "hf-assisted": "transformers' own assisted generation on the pair's weights (torch runtime)",
    "llamacpp-ar": "llama-cpp-python's own generation of the target's GGUF file",
    "llamacpp-ar-same": "llama-cpp-python's own generation of the file Tandem's llama.cpp runtime runs, where that is another (by default the target's Q8_0 copy)",
    # llama.cpp's own C++ server (what LM Studio and Ollama run), where the program is found
    "llama-server": "llama.cpp's own llama-server: plain decoding of the target's GGUF file",
    "llama-server-ngram": "llama.cpp's own llama-server: draftless speculative decoding (--spec-type ngram-mod)",
    "llama-server-draft": "llama.cpp's own llama-server: speculative decoding with a draft GGUF (-md), at --synthetic-acceptance's rates where given",
}
