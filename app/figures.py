"""The speed figures of a reply, as saved with it and as shown under it and in the speed panel.

A reply's figures are a plain dict (JSON in the chat database), so a reply saved by an older
version still shows, and the panel and the message line format them the same way.
"""
from __future__ import annotations

import math

from engine import methods
from engine.config import DecodeSettings
from engine.heads.figures import describe_sprinter, sprinter_figures
from engine.stats import GenerationStats

STOP_REASONS = {
    "eos": "the model ended its reply",
    "length": "reached the token limit",
    "context": "filled the model's context",
    "stopped": "stopped by you",
}
EXACT_VERIFIER, SPRINTER_VERIFIER = "Exact", methods.label("sprinter")

# One sentence for each figure, in the words of someone who has never read a paper on
# speculative decoding: the speed panel's tooltips, and the same for a reply's Details.
FIGURE_TIPS = {
    "speed": "Reply tokens written per second, from the first token of the reply to the last (reading your message not included).",
    "first_token": "How long you waited for the first word of the reply: mostly the time to read your message and the conversation before it.",
    "verifier": "Exact: the big (target) model checked every token, so the reply is what it alone would write. "
                "SPRINTER (approximate): a learned verifier let some tokens out without that check.",
    "unchecked": "The share of reply tokens that went out without the target model ever checking them (SPRINTER only).",
    "skipped": "Rounds in which every drafted token passed SPRINTER's verifier, so the target model was not called at all.",
    "quality": "How SPRINTER's verifier did on prompts held out of its calibration: how many wrong tokens it lets through, "
               "and how often it guesses the target's verdict right.",
    "acceptance": "Of the tokens the small (draft) model guessed, the share the target model agreed with and kept; "
                  "higher means fewer wasted guesses.",
    "per_call": "Reply tokens written per call of the target model (tok/call), the end-of-reply token included; "
                "plain decoding writes 1, so 2.5 means each expensive call wrote 2.5 tokens.",
    "saved": "How many fewer target-model calls this reply needed than plain decoding, which calls it once per token.",
    "mode": "The decoding method and its settings that wrote this reply (change them in the toolbar or Settings → Decoding).",
    "device": "Where the models run (CPU or GPU) and the number format of their weights.",
    "runtime": "What runs the models: torch (transformers) or llama.cpp (GGUF files, in the format they are stored in). "
               "On the CPU, Tandem's native forward runs Llama, Mistral, Qwen2 and Qwen3 models from Hugging Face folders "
               "(SiLU, RMSNorm, no sliding windows) at int8; other torch models are compiled in the background.",
    "memory": "Memory the loaded pair takes: RAM on a CPU, GPU memory on a GPU.",
    "time_share": "How the reply's compute time was split between the small draft model and the big target model.",
    "by_position": "For the 1st, 2nd, 3rd… guessed token of a round: how often the target kept it. Later guesses are kept less often, "
                   "since each needs all earlier ones to be right.",
}


def method_title(method: str) -> str:
    return methods.label(method)


def reply_figures(
    stats: GenerationStats, settings: DecodeSettings, verifier_label: str, pair: dict, stop_reason: str,
    quality: dict | None = None,
) -> dict:
    """`quality`: for an approximate reply, the held-out figures of the verifier that wrote it."""
    figures = {
        "stats": stats.to_dict(),
        "decoding": settings.to_dict(),
        "verifier_label": verifier_label,
        "pair": pair,
        "stop_reason": stop_reason,
    }
    if quality:
        figures["quality"] = quality
    return figures


def sprinter_quality(card: dict | None, greedy: bool) -> dict | None:
    """SPRINTER's held-out figures from a heads card, for the decoding mode a reply uses."""
    return sprinter_figures(card, greedy)


def quality_text(quality: dict | None) -> str:
    """The held-out figures in plain words (engine/heads/figures.py); "—" without any."""
    return describe_sprinter(quality) if quality else "—"


def is_approximate(figures: dict) -> bool:
    stats, decoding = figures.get("stats", {}), figures.get("decoding", {})
    return not stats.get("exact", True) or not methods.is_exact(decoding.get("method", ""))


def verifier_name(figures: dict) -> str:
    """Which verifier produced a reply; replies saved before SPRINTER existed were exact."""
    return SPRINTER_VERIFIER if is_approximate(figures) else EXACT_VERIFIER


def unchecked(stats: dict) -> str:
    tokens, unchecked_tokens = stats.get("tokens_generated", 0), stats.get("unchecked_tokens", 0)
    if not tokens:
        return "—"
    return f"{percent(unchecked_tokens / tokens)} ({unchecked_tokens} of {tokens} tokens never seen by the target)"


def calls_skipped(stats: dict) -> str:
    skipped = stats.get("target_calls_skipped", 0)
    return f"{skipped} (every token of the round passed the verifier)"


def ended(figures: dict) -> str:
    """How a reply ended, in words: 'the model ended its reply', 'reached the 512-token limit'."""
    reason = figures.get("stop_reason", "")
    limit = token_limit(figures)
    if limit is not None:
        return f"reached the {limit}-token limit"
    return STOP_REASONS.get(reason, reason or "—")


def token_limit(figures: dict) -> int | None:
    """The token limit a reply stopped at, or None when it ended otherwise."""
    if figures.get("stop_reason") != "length":
        return None
    return figures.get("decoding", {}).get("max_new_tokens")


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} tok/s"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def reading(fraction: float, seconds_left: float | None = None) -> str:
    """What a reply waits for while the models read a long prompt, and for how much longer."""
    left = "" if seconds_left is None or seconds_left <= 0 else f" · about {duration(seconds_left)} left"
    return f"Reading your message… {fraction:.0%}{left}"


def duration(seconds: float) -> str:
    """'40 s', '2 min 10 s', '5 min': a wait, rounded as a person would say it."""
    if seconds <= 59:
        return f"{max(1, math.ceil(seconds))} s"
    minutes, rest = divmod(round(seconds / 10) * 10, 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def decoding_mode(decoding: dict, verifier_label: str = "") -> str:
    """'chain, K=4, block verification, greedy' or 'tree, auto shape, temperature 0.7' —
    what produced a reply."""
    method = decoding.get("method", "?")
    parts = [method_title(method)]
    knob = methods.BY_NAME[method].knob if method in methods.BY_NAME else methods.KNOB_NONE
    chain = knob in (methods.KNOB_DRAFT_TOKENS, methods.KNOB_ADAPTIVE)  # SPRINTER checks one flagged token a round
    if knob == methods.KNOB_ADAPTIVE:
        parts.append(f"up to {decoding.get('adaptive_max_tokens', 16)} drafted")
    elif knob == methods.KNOB_UNCHECKED:
        parts.append(f"up to {decoding.get('sprinter_max_unchecked', 16)} unchecked in a row")
    elif knob == methods.KNOB_DRAFT_TOKENS:
        parts.append(f"K={decoding.get('draft_tokens', '?')}")
    elif knob == methods.KNOB_TREE_SHAPE:
        shape = decoding.get("tree_shape", "auto")
        parts.append("auto shape" if shape == "auto" else f"{shape} tree")
    temperature = decoding.get("temperature", 0.0)
    if temperature == 0:
        parts.append("greedy")
    else:
        if chain and verifier_label:  # trees accept by one target sample per node, not by a verifier choice
            parts.append(verifier_label)
        parts.append(f"temperature {temperature:g}")
        if decoding.get("top_p", 1.0) < 1.0:
            parts.append(f"top-p {decoding['top_p']:g}")
        if decoding.get("top_k", 0):
            parts.append(f"top-k {decoding['top_k']}")
    return ", ".join(parts)


def calls_saved(stats: dict) -> str:
    """'23 (20 target calls for 43 tokens)': the tokens count the end-of-reply token, as the
    saving and the tokens per call do, so that the three figures add up."""
    tokens, calls = stats.get("tokens_generated", 0), stats.get("target_calls", 0)
    if not tokens:
        return "—"
    produced = tokens + stats.get("stop_tokens", 0)
    end_token = " with the end token" if stats.get("stop_tokens") else ""
    return f"{stats.get('target_calls_saved', 0)} ({calls} target calls for {produced} tokens{end_token})"


def by_position(stats: dict) -> str:
    rates = stats.get("acceptance_by_position") or []
    if not rates:
        return "—"
    return " · ".join(f"{index}: {value * 100:.0f}%" for index, value in enumerate(rates, start=1))


def time_share(stats: dict) -> str:
    share = stats.get("draft_time_share")
    if share is None:
        return "—"
    return f"draft {share * 100:.0f}% · target {(1 - share) * 100:.0f}%"


def memory(megabytes: float | None) -> str:
    if megabytes is None:
        return "—"
    return f"{megabytes / 1024:.2f} GB" if megabytes >= 1024 else f"{megabytes:.0f} MB"


def compact_line(figures: dict) -> str:
    """One line under a reply: speed, first token, acceptance, tokens per call, mode."""
    stats, decoding = figures.get("stats", {}), figures.get("decoding", {})
    parts = [rate(stats.get("tokens_per_s")), f"first token {seconds(stats.get('time_to_first_token_s'))}"]
    if is_approximate(figures):
        tokens = stats.get("tokens_generated", 0)
        parts.append(f"{percent(stats.get('unchecked_tokens', 0) / tokens if tokens else None)} unchecked")
    elif decoding.get("method") != "ar":
        parts.append(f"{percent(stats.get('acceptance_rate'))} accepted")
    if decoding.get("method") != "ar":
        parts.append(f"{ratio(stats.get('mean_accepted_per_target_call'))} tok/call")
    parts.append(decoding_mode(decoding, figures.get("verifier_label", "")))
    if stats.get("note"):  # what `auto` chose, and why
        parts.append(stats["note"].removeprefix("auto: "))
    return " · ".join(parts)


def rounds_by_method(stats: dict) -> str:
    """'eagle-tree 42 · ar 3': the rounds each method ran (for `auto`)."""
    counts = stats.get("rounds_by_method") or {}
    return " · ".join(f"{name} {count}" for name, count in sorted(counts.items(), key=lambda item: -item[1])) or "—"


def detail_rows(figures: dict) -> list[tuple[str, str]]:
    stats, decoding, pair = figures.get("stats", {}), figures.get("decoding", {}), figures.get("pair", {})
    tokens = stats.get("tokens_generated", 0)
    rows = [
        ("Speed", f"{rate(stats.get('tokens_per_s'))} ({tokens} tokens in {seconds(stats.get('elapsed_s'))})"),
        ("First token", seconds(stats.get("time_to_first_token_s"))),
        ("Decoding", decoding_mode(decoding, figures.get("verifier_label", ""))),
        ("Verifier", verifier_name(figures)),
    ]
    if stats.get("note"):
        rows += [("Chosen", stats["note"]), ("Rounds by method", rounds_by_method(stats))]
    if is_approximate(figures):
        rows += [
            ("Unchecked tokens", unchecked(stats)),
            ("Rounds without a target call", calls_skipped(stats)),
            ("Held-out quality", quality_text(figures.get("quality"))),
        ]
    if decoding.get("method") != "ar":
        accepted, proposed = stats.get("draft_tokens_accepted", 0), stats.get("draft_tokens_proposed", 0)
        checked = "flagged tokens the target checked" if is_approximate(figures) else "drafted tokens"
        rows += [
            ("Acceptance", f"{percent(stats.get('acceptance_rate'))} ({accepted} of {proposed} {checked})"),
            ("Tokens per target call", ratio(stats.get("mean_accepted_per_target_call"))),
            ("Target calls saved", calls_saved(stats)),
            ("Acceptance by position", by_position(stats)),
            ("Time", time_share(stats)),
        ]
    rows += [
        ("Prompt", f"{stats.get('prompt_tokens', 0)} tokens"),
        ("Ended", ended(figures)),
    ]
    if pair:
        head = f" + EAGLE-3 head {pair['eagle']}" if pair.get("eagle") else ""
        rows.append(("Pair", f"{pair.get('name', '?')}: {pair.get('target', '?')} + {pair.get('draft', '?')}{head}"))
        rows.append(("Device", f"{pair.get('device', '?')}, {pair.get('precision', '?')}, {memory(pair.get('memory_mb'))}"))
        rows.append(("Runtime", pair.get("runtime", "torch")))
        if pair.get("runtime_choice"):
            rows.append(("Runtime chosen", pair["runtime_choice"]))
    return rows


def calibration_step(phase: str, done: int, total: int) -> str:
    """'Target replies 12 / 160' or 'Training heads 1 / 2': where a calibration is."""
    what = "Target replies" if phase == "replies" else "Training heads" if phase == "training" else phase
    return f"{what} {done} / {total}"


def heads_data(card: dict) -> str:
    """What a pair's heads were calibrated on."""
    data = card.get("data", {})
    prompts, heldout, tokens = data.get("prompts"), data.get("heldout_prompts"), data.get("reply_tokens")
    if prompts is None:
        return "Calibrated heads; their card says nothing of the data."
    tokens_text = f" ({tokens:,} reply tokens)" if tokens is not None else ""
    heldout_text = f"; figures measured on the {heldout} prompts held out of training" if heldout else ""
    return f"Calibrated on {prompts} prompts{tokens_text}{heldout_text}."


def heads_rows(card: dict) -> list[tuple[str, str, str]]:
    """The held-out figures of a heads card, (what, greedy, sampled)."""

    def both(read) -> tuple[str, str]:
        values = []
        for mode in ("greedy", "sampled"):
            try:
                values.append(read(card["modes"][mode]))
            except (KeyError, TypeError, ValueError):
                values.append("—")
        return tuple(values)

    def rate_with_constant(value: float, constant: float) -> str:
        return f"{percent(value)} (constant {percent(constant)})"

    return [
        ("SPRINTER η: rejected tokens let through", *both(lambda m: f"{m['sprinter']['false_positive_rate'] * 100:.1f}%")),
        ("Tokens SPRINTER passes unchecked", *both(lambda m: percent(m["sprinter"]["pass_rate"]))),
        ("SPRINTER verifier accuracy",
         *both(lambda m: rate_with_constant(m["sprinter"]["accuracy"], m["sprinter"]["constant_accuracy"]))),
        ("SpecDec++ head loss (lower is better)",
         *both(lambda m: f"{m['acceptance']['bce']:.3f} (constant {m['acceptance']['constant_bce']:.3f})")),
    ]
