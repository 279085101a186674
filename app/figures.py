"""The speed figures of a reply, as saved with it and as shown under it and in the speed panel.

A reply's figures are a plain dict (JSON in the chat database), so a reply saved by an older
version still shows, and the panel and the message line format them the same way.
"""
from __future__ import annotations

from engine.config import TREE_METHODS, DecodeSettings
from engine.stats import GenerationStats

STOP_REASONS = {
    "eos": "the model ended its reply",
    "length": "reached the token limit",
    "stopped": "stopped by you",
}


def reply_figures(
    stats: GenerationStats, settings: DecodeSettings, verifier_label: str, pair: dict, stop_reason: str
) -> dict:
    return {
        "stats": stats.to_dict(),
        "decoding": settings.to_dict(),
        "verifier_label": verifier_label,
        "pair": pair,
        "stop_reason": stop_reason,
    }


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} tok/s"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def reading(fraction: float) -> str:
    """What a reply waits for while the models read a long prompt."""
    return f"Reading your message… {fraction:.0%}"


def decoding_mode(decoding: dict, verifier_label: str = "") -> str:
    """'chain, K=4, block verification, greedy' or 'tree, auto shape, temperature 0.7' —
    what produced a reply."""
    method = decoding.get("method", "?")
    parts = [method]
    chain = method not in ("ar", *TREE_METHODS)
    if chain:
        parts.append(f"K={decoding.get('draft_tokens', '?')}")
    elif method in TREE_METHODS:
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
    tokens, calls = stats.get("tokens_generated", 0), stats.get("target_calls", 0)
    if not tokens:
        return "—"
    return f"{stats.get('target_calls_saved', 0)} ({calls} target calls for {tokens} tokens)"


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
    if decoding.get("method") != "ar":
        parts.append(f"{percent(stats.get('acceptance_rate'))} accepted")
        parts.append(f"{ratio(stats.get('mean_accepted_per_target_call'))} tok/call")
    parts.append(decoding_mode(decoding, figures.get("verifier_label", "")))
    return " · ".join(parts)


def detail_rows(figures: dict) -> list[tuple[str, str]]:
    stats, decoding, pair = figures.get("stats", {}), figures.get("decoding", {}), figures.get("pair", {})
    tokens = stats.get("tokens_generated", 0)
    rows = [
        ("Speed", f"{rate(stats.get('tokens_per_s'))} ({tokens} tokens in {seconds(stats.get('elapsed_s'))})"),
        ("First token", seconds(stats.get("time_to_first_token_s"))),
        ("Decoding", decoding_mode(decoding, figures.get("verifier_label", ""))),
    ]
    if decoding.get("method") != "ar":
        accepted, proposed = stats.get("draft_tokens_accepted", 0), stats.get("draft_tokens_proposed", 0)
        rows += [
            ("Acceptance", f"{percent(stats.get('acceptance_rate'))} ({accepted} of {proposed} drafted tokens)"),
            ("Tokens per target call", ratio(stats.get("mean_accepted_per_target_call"))),
            ("Target calls saved", calls_saved(stats)),
            ("Acceptance by position", by_position(stats)),
            ("Time", time_share(stats)),
        ]
    rows += [
        ("Prompt", f"{stats.get('prompt_tokens', 0)} tokens"),
        ("Ended", STOP_REASONS.get(figures.get("stop_reason", ""), figures.get("stop_reason", "—"))),
    ]
    if pair:
        rows.append(("Pair", f"{pair.get('name', '?')}: {pair.get('target', '?')} + {pair.get('draft', '?')}"))
        rows.append(("Device", f"{pair.get('device', '?')}, {pair.get('precision', '?')}, {memory(pair.get('memory_mb'))}"))
        rows.append(("Runtime", pair.get("runtime", "torch")))
    return rows
