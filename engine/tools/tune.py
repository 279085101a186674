"""`tandem tune`: the runtime and precision a pair runs on here, chosen by speculative throughput.

Plain decoding speed alone picks the wrong runtime for speculation: what a draft buys depends
on what a verify of many tokens costs next to one step, and that curve differs far more
between runtimes than a step does. So:

1. Each candidate (llama.cpp where the pair has GGUF files; torch at its 8-bit default, and
   bf16 on a GPU) loads the pair, waits for its background compile, and records its cost
   table: a target forward over 1-64 tokens and one call of each drafter (`costs.py`).
2. The first candidate that loads writes greedy replies with every exact method the pair
   offers, trees at one fixed shape (the automatic shape would fit the trees to that first
   runtime's costs: on a CPU it mostly stops drafting). What was drafted and accepted is
   then the models' doing, not the runtime's, so those same rounds are re-priced with each
   candidate's table. What the table does not price (Python, sampling, accepting a tree,
   a draft reading the prompt) is what the reply took beyond its price on the first
   candidate's own table, and is added to each candidate alike: the first candidate's
   prediction is its measured speed.
3. Each other candidate then writes the same replies with the method predicted fastest on it,
   and the candidate whose replies measured fastest is saved for the pair on this machine
   (`engine.runtime_choice`), where "auto" runtime finds it. The prediction picks a method per
   runtime from its verify curve; the measurement confirms it, because what a table leaves
   out differs between runtimes too (on this CPU the first predictions put compiled torch's
   plain decoding at 65.6 tok/s where it measured 53.0; docs/BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import methods
from ..config import STORED, ConfigError, DecodeSettings, PairConfig
from ..errors import TandemError
from ..runtime.device import OUT_OF_MEMORY_ERRORS
from ..runtime_choice import RuntimeChoice, runtime_label, save_choice
from .bench import Bench, MethodResult, machine_description
from .costs import CostTable, drafter_of, measure_costs

DEFAULT_PROMPTS = 6
DEFAULT_MAX_NEW_TOKENS = 96
TREE_SHAPE = "8x4"  # the trees' fixed shape while replies are written: 8 nodes, 4 deep


@dataclass(frozen=True)
class Candidate:
    runtime: str  # "llama.cpp" or "torch"
    precision: str  # the target's precision ("auto": the runtime's own default)

    @property
    def label(self) -> str:
        return runtime_label(self.runtime, self.precision)

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """"llama.cpp", "torch" or "torch:bf16"."""
        runtime, _, precision = text.strip().partition(":")
        from ..config import PRECISIONS, RUNTIMES

        if runtime not in RUNTIMES or runtime == "auto":
            raise ConfigError(f"unknown runtime {runtime!r} in {text!r}; one of llama.cpp, torch (e.g. torch:int8-wo)")
        if precision and precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r} in {text!r}; one of {', '.join(PRECISIONS)}")
        return cls(runtime, precision or "auto")


def default_candidates(config: PairConfig) -> list[Candidate]:
    """What "auto" could mean for `config` here: llama.cpp where the target has a GGUF file,
    torch at its own default, and on a GPU torch in bf16 too."""
    from ..models import runtime_gguf
    from ..runtime.device import resolve_device

    found = [Candidate("torch", "auto")]
    gguf = runtime_gguf(config.target, "auto")
    if gguf is not None:
        found.insert(0, Candidate("llama.cpp", "auto"))
        if _stored_below_8_bits(gguf):  # as it is, besides its Q8_0 copy
            found.insert(1, Candidate("llama.cpp", STORED))
    if resolve_device(config.target.device).type == "cuda":
        found.append(Candidate("torch", "bf16"))
    return found


def _stored_below_8_bits(gguf: Path) -> bool:
    """Whether a GGUF file holds weights of fewer bits than Q8_0 (Q4_K_M, Q5_K_S, IQ4_XS…)."""
    from ..discovery.gguf_header import UnreadableGGUF, read_gguf_header

    try:
        file_type = read_gguf_header(gguf).file_type
    except (OSError, UnreadableGGUF):
        return False
    return file_type not in ("", "Q8_0", "F16", "BF16", "F32")


def predicted_tokens_per_s(result: MethodResult, written_on: CostTable, table: CostTable) -> float:
    """`result`'s replies, written where `written_on` was measured, at `table`'s prices: each
    model call re-priced, what the tables do not price kept as it was."""
    drafter = drafter_of(result.method)
    tokens, seconds = 0, 0.0
    for run in result.runs:
        # Not clamped at zero: a table's median may price a call above what it took in this
        # reply, and the difference then belongs to every candidate alike.
        unpriced = run.seconds - written_on.reply_seconds(run.stats, drafter)
        seconds += unpriced + table.reply_seconds(run.stats, drafter)
        tokens += len(run.token_ids)
    return tokens / seconds if seconds > 0 else 0.0


def choose(
    replies: dict[str, MethodResult], written_on: CostTable, tables: dict[Candidate, CostTable]
) -> tuple[Candidate, str, dict[str, dict[str, float]]]:
    """The fastest (candidate, method), and every candidate's predicted tokens/s per method."""
    predicted = {candidate.label: _predicted(replies, written_on, table) for candidate, table in tables.items()}
    best = max(tables, key=lambda candidate: max(predicted[candidate.label].values()))
    method = max(predicted[best.label], key=predicted[best.label].__getitem__)
    return best, method, predicted


def _predicted(replies: dict[str, MethodResult], written_on: CostTable, table: CostTable) -> dict[str, float]:
    """Each method's replies, re-priced with `table`: predicted tokens/s."""
    return {method: predicted_tokens_per_s(result, written_on, table) for method, result in replies.items()}


def tune(
    config: PairConfig, candidates: list[Candidate], prompts: list[str], settings: DecodeSettings,
    load: Callable[[PairConfig, RuntimeChoice], Any], progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every candidate, choose, save; returns the report. `load(config, choice)` loads
    the pair with its target placed by `choice` (session.load_pair)."""
    tables: dict[Candidate, CostTable] = {}
    skipped: dict[str, str] = {}
    replies: dict[str, MethodResult] | None = None
    measured_on: Candidate | None = None
    confirmed: dict[Candidate, tuple[str, float]] = {}  # each candidate's predicted-best method, as measured
    plans: dict[str, str] = {}  # each torch candidate's forward plan for the target
    machine: dict[str, Any] = {}
    settings = settings.with_changes(tree_shape=TREE_SHAPE)
    for candidate in candidates:
        progress(f"{candidate.label}: loading the pair…")
        try:
            pair = load(config, _as_choice(candidate))
        except (TandemError, ConfigError, *OUT_OF_MEMORY_ERRORS) as error:  # a runtime this pair cannot use here
            skipped[candidate.label] = str(error)
            progress(f"{candidate.label}: skipped ({error})")
            continue
        if pair.target.forward_plan_line:
            plans[candidate.label] = pair.target.forward_plan_line
            progress(f"{candidate.label}: forward plan {pair.target.forward_plan_line}")
        try:
            _measure(candidate, pair, tables, machine, progress)
            if replies is None:
                offered = [m for m in pair.methods if methods.is_exact(m) and m != "auto"]
                progress(f"{candidate.label}: replies with {', '.join(offered)} ({len(prompts)} prompts)…")
                replies, measured_on = Bench(pair, settings).replies(prompts, offered, progress), candidate
                speeds = {method: _measured(result) for method, result in replies.items()}
                confirmed[candidate] = (max(speeds, key=speeds.__getitem__), max(speeds.values()))
            else:
                predicted = _predicted(replies, tables[measured_on], tables[candidate])
                method = max(predicted, key=predicted.__getitem__)
                progress(f"{candidate.label}: replies with {method}, predicted fastest here ({predicted[method]:.1f} tok/s)…")
                confirmed[candidate] = (method, _measured(Bench(pair, settings).replies(prompts, [method], progress)[method]))
        except (TandemError, *OUT_OF_MEMORY_ERRORS) as error:  # e.g. a GPU that fits the weights but not a verify
            tables.pop(candidate, None)
            confirmed.pop(candidate, None)
            skipped[candidate.label] = str(error) or type(error).__name__
            progress(f"{candidate.label}: skipped ({error})")
        finally:
            pair.close()
    if replies is None or measured_on is None:
        raise ConfigError("no candidate runtime could load the pair: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    _, _, predicted = choose(replies, tables[measured_on], tables)
    best = max(confirmed, key=lambda candidate: confirmed[candidate][1])
    method, speed = confirmed[best]
    choice = RuntimeChoice(best.runtime, best.precision, method, speed, time.strftime("%Y-%m-%d"),
                           {candidate.label: measured for candidate, (_, measured) in confirmed.items()})
    saved = save_choice(config, choice)
    return {
        "machine": machine, "pair": config.name, "chosen": choice.to_dict(), "saved_to": str(saved),
        "replies_measured_on": measured_on.label, "tree_shape": TREE_SHAPE,
        "measured_tokens_per_s": {method: _measured(result) for method, result in replies.items()},
        "predicted_tokens_per_s": predicted,
        "confirmed": {candidate.label: {"method": m, "tokens_per_s": s} for candidate, (m, s) in confirmed.items()},
        "cost_tables": {candidate.label: table.to_dict() for candidate, table in tables.items()},
        "forward_plans": plans,
        "skipped": skipped,
    }


def _measure(candidate: Candidate, pair: Any, tables: dict[Candidate, CostTable], machine: dict[str, Any], progress: Callable[[str], None]) -> None:
    """`candidate`'s cost table, once its background compile is done; `machine` is filled in
    the first time."""
    if pair.has_background_work:
        progress(f"{candidate.label}: compiling the forwards first (minutes the first time)…")
        started = time.perf_counter()
        pair.wait_for_background_work()
        progress(f"{candidate.label}: runtime {pair.runtime_label} (waited {time.perf_counter() - started:.0f} s)")
    if not machine:
        machine.update(machine_description(pair))
    progress(f"{candidate.label}: measuring what a call costs…")
    tables[candidate] = measure_costs(pair, machine.get("gpu") or machine["processor"])


def _as_choice(candidate: Candidate) -> RuntimeChoice:
    return RuntimeChoice(candidate.runtime, candidate.precision, "", 0.0, "")


def _measured(result: MethodResult) -> float:
    seconds = sum(run.seconds for run in result.runs)
    return sum(len(run.token_ids) for run in result.runs) / seconds if seconds > 0 else 0.0


def format_report(report: dict[str, Any]) -> str:
    predicted = report["predicted_tokens_per_s"]
    method_names = list(next(iter(predicted.values())))
    lines = [f"Predicted tok/s per runtime (replies written on {report['replies_measured_on']}, trees {report['tree_shape']}, "
             f"re-priced with each runtime's measured costs; measured there: "
             + ", ".join(f"{m} {s:.1f}" for m, s in report["measured_tokens_per_s"].items()) + ")", ""]
    width = max(len(label) for label in predicted) + 2
    lines.append("runtime".ljust(width) + "".join(f"{m:>12}" for m in method_names) + "   verify 1/8 ms")
    for label, speeds in predicted.items():
        verify = report["cost_tables"][label]["target_verify_ms"]
        lines.append(label.ljust(width) + "".join(f"{speeds[m]:>12.1f}" for m in method_names)
                     + f"   {verify['1']:.1f}/{verify['8']:.1f}")
    for label, reason in report["skipped"].items():
        lines.append(f"{label.ljust(width)}skipped: {reason}")
    for label, plan in report.get("forward_plans", {}).items():
        lines.append(f"{label.ljust(width)}forward plan: {plan}")
    lines += ["", "Measured, each runtime with the method predicted fastest on it: "
              + ", ".join(f"{label} {row['method']} {row['tokens_per_s']:.1f} tok/s" for label, row in report["confirmed"].items())]
    chosen = report["chosen"]
    lines += ["", f"Chosen: {runtime_label(chosen['runtime'], chosen['precision'])} ({chosen['method']}, "
                  f"{chosen['tokens_per_s']:.1f} tok/s measured), saved to {report['saved_to']}.",
              "A pair whose runtime and target precision are \"auto\" now loads on it here."]
    return "\n".join(lines)


def add_tune_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "tune",
        help="choose the runtime and precision an \"auto\" pair runs on here, by measured speculative throughput",
        description="Loads the pair on each candidate runtime, measures what a verify of 1-64 tokens and a draft call "
        "cost there, writes greedy replies once with every exact method, re-prices those replies with each "
        "runtime's costs to predict its fastest method, measures that method on each runtime, and saves the "
        "runtime that measured fastest for this pair on this machine. Pairs whose runtime and target "
        "precision are auto then load on it (the app, tandem chat and tandem bench alike).",
    )
    command.add_argument("--pair", default="demo", help="a pair name (demo, or one saved in the app) or a pair JSON file")
    command.add_argument("--candidates", help="comma-separated RUNTIME[:PRECISION], e.g. llama.cpp,torch,torch:bf16 "
                         "(default: llama.cpp where the target has a GGUF file, torch, and torch:bf16 on a GPU)")
    command.add_argument("--prompts", type=Path, help="JSON Lines file with a \"prompt\" key per line (default: shipped set)")
    command.add_argument("--limit", type=int, default=DEFAULT_PROMPTS, help=f"prompts to reply to (default: {DEFAULT_PROMPTS})")
    command.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                         help=f"reply length (default: {DEFAULT_MAX_NEW_TOKENS})")
    command.add_argument("--json", type=Path, dest="json_out", help="write the full report here")
    command.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from ..pairs import find_pair
    from ..prompts import CHAT_PROMPTS, read_prompts
    from ..session import load_pair

    config = find_pair(args.pair)
    if config.runtime != "auto" or config.target.precision != "auto":
        print(f"note: pair {config.name!r} fixes its runtime ({config.runtime}) or precision ({config.target.precision}); "
              "the choice applies only once both are auto", file=sys.stderr)
        config = dataclasses.replace(config, runtime="auto", target=dataclasses.replace(config.target, precision="auto"))
    candidates = ([Candidate.parse(text) for text in args.candidates.split(",") if text.strip()]
                  if args.candidates else default_candidates(config))
    prompts = read_prompts(args.prompts or CHAT_PROMPTS)[: max(1, args.limit)]

    def report(line: str) -> None:
        print(f"  {line}", file=sys.stderr)

    def load(pair_config: PairConfig, choice: RuntimeChoice):
        return load_pair(pair_config, lambda message, fraction: report(message), choice)

    result = tune(config, candidates, prompts, DecodeSettings(max_new_tokens=args.max_new_tokens), load, report)
    print(format_report(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"report written to {args.json_out}", file=sys.stderr)
    return 0
