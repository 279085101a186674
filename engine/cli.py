"""The `tandem` console command: no argument opens the desktop app; subcommands run headless."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import time
from pathlib import Path

from . import heap, methods, paths
from .about import paths_report, version_report
from .config import CHAT_DEFAULT_TEMPERATURE, DEVICES, PRECISIONS, RUNTIMES, VERIFIERS, ConfigError, DecodeSettings, ModelSpec, PairConfig
from .errors import TandemError

# Options that only print something, answered before the full parser is built (building it
# imports torch): `tandem --version` returns in a fraction of a second.
REPORTS = {
    "--version": (version_report, "print the versions of Tandem, llama-cpp-python, torch, transformers and PySide6"),
    "--paths": (paths_report, "print the folders of settings, chats and caches (TANDEM_HOME moves all three)"),
}

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    heap.limit_arenas()  # before the engine's and llama.cpp's threads start (engine/heap.py)
    paths.keep_compiled_kernels()  # before anything asks inductor for its folder
    if not argv:
        return _launch_desktop_app()
    if argv[0] in REPORTS:
        report, _help = REPORTS[argv[0]]
        print(report())
        return 0
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (TandemError, ConfigError) as error:
        print(f"tandem: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _launch_desktop_app() -> int:
    # Qt is loaded only when the window is asked for: the engine and the headless
    # subcommands run on machines without a display or Qt libraries.
    app_main = importlib.import_module("app.main")
    return app_main.main([])


def _parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: these modules import torch and transformers (3 s warm,
    # 14 s from a cold disk), which `tandem` alone must not wait for before opening its window.
    from .tools.distill.command import add_distill_command
    from .tools.ngram_table import add_ngram_table_command
    from .tools.export_gguf_command import add_export_gguf_command
    from .tools.calibrate.command import add_calibrate_command
    from .tools.tune import add_tune_command
    from .serve.limits import ServerLimits

    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Offline chat with local language models, sped up by speculative decoding. "
        "Run without arguments to open the desktop app.",
    )
    for option, (report, help_text) in REPORTS.items():
        parser.add_argument(option, action=_PrintReport, report=report, help=help_text)
    commands = parser.add_subparsers(dest="command", required=True)

    chat = commands.add_parser("chat", help="chat in the terminal, with streaming output and a live stats line")
    _add_pair_arguments(chat)
    _add_decoding_arguments(chat, default_temperature=CHAT_DEFAULT_TEMPERATURE)
    chat.add_argument("--system", help="system prompt")
    chat.set_defaults(run=_run_chat)

    bench = commands.add_parser("bench", help="measure decoding methods on one pair")
    _add_pair_arguments(bench)
    _add_decoding_arguments(bench, default_max_new_tokens=128)
    bench.add_argument(
        "--prompts", type=Path,
        help="JSON Lines file with a \"prompt\" key per line (and a \"kind\" to report by), or a shipped set: chat "
        "(the default) or task-kinds (chat, translation, summarization, qa, math, code: four prompts each)",
    )
    bench.add_argument("--kind", help="only the prompts of these kinds (comma-separated), e.g. summarization,qa")
    bench.add_argument("--limit", type=int, help="use only the first N prompts")
    bench.add_argument(
        "--methods", default="ar,chain",
        help=f"comma-separated methods ({', '.join(methods.NAMES + tuple(methods.BENCH_PEERS))}), "
        "or all = every one the pair "
        "offers (adaptive and sprinter need calibrated draft heads; sprinter is approximate); default = the method "
        "the app and tandem chat use for the pair (default: ar,chain). "
        "After the timed runs every output is scored: the target's NLL per token at temperature 1 (nll, lower "
        "is closer to the target) and ROUGE-L F1 against ar's output (rougeL, 1 = same text)",
    )
    bench.add_argument("--json", type=Path, dest="json_out", help="write the full report here")
    bench.add_argument(
        "--record-costs", type=Path, metavar="FILE",
        help="measure what one target forward over 1-64 tokens and one call of each drafter cost on this machine, "
        "and write that cost table to FILE (before the timed runs)",
    )
    bench.add_argument(
        "--cost-table", type=Path, metavar="FILE",
        help="also re-time every reply with another device's cost table (from --record-costs there) and show a "
        "'predicted' tok/s column for that device: what was drafted and accepted here, at that device's prices",
    )
    bench.add_argument("--profile", type=int, metavar="N", default=0, help="also print the N functions that took the most time")
    bench.add_argument(
        "--synthetic-acceptance", metavar="P1,P2,...", type=_rates, default=(),
        help="benchmark the machinery at given acceptance: keep the draft token at depth d with probability Pd "
        "(unconditional and non-increasing, as llama.cpp's --spec-synth-rates) instead of by the target's agreement; "
        "drafters and the target run and pay their real cost; the replies are NOT valid text",
    )
    bench.add_argument(
        "--llama-server", type=Path, metavar="PATH",
        help="llama.cpp's own llama-server program, for the llama-server rows (default: $LLAMA_SERVER, or one on PATH): "
        "its plain decoding, ngram-mod and draft-model speculation on the target's GGUF with the same prompts",
    )
    bench.add_argument("--llama-server-draft", type=Path, metavar="GGUF", help="the draft GGUF of the llama-server-draft row")
    bench.add_argument(
        "--llama-server-target", type=Path, metavar="GGUF",
        help="the target GGUF the llama-server rows run (default: the target's own file): the same weights where "
             "Tandem runs a folder, so that both are timed in one run",
    )
    bench.set_defaults(run=_run_bench)

    serve = commands.add_parser(
        "serve", help="serve the pair to other programs over a local OpenAI-compatible HTTP API "
        "(/v1/chat/completions, /v1/completions, /v1/models, /health)",
    )
    _add_pair_arguments(serve)
    serve.add_argument(
        "--host", default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 opens it to the network)",
    )
    serve.add_argument("--port", type=int, default=8080, help="(default: 8080)")
    serve.add_argument(
        "--api-key", default=os.environ.get("TANDEM_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every /v1 request (default: $TANDEM_API_KEY, else none)",
    )
    limits = ServerLimits()
    serve.add_argument(
        "--max-tokens-limit", type=_at_least_one, default=limits.max_tokens,
        help=f"the most tokens a request's max_tokens may ask for, and what one that sets none gets (default: {limits.max_tokens})",
    )
    serve.add_argument(
        "--max-waiting", type=_at_least_one, default=limits.max_waiting,
        help=f"requests that may wait while one is generated; more are refused with 503 (default: {limits.max_waiting})",
    )
    serve.set_defaults(run=_run_serve)

    soak = commands.add_parser(
        "soak", help="send many replies through the desktop app's engine thread and chat store, switching methods "
        "and pairs and stopping some; check that memory stays flat, no thread is left and every reply is saved",
    )
    _add_pair_arguments(soak)
    soak.add_argument("--replies", type=int, default=200, help="replies to send (default: 200)")
    soak.add_argument("--max-new-tokens", "--max-tokens", type=int, default=64, help="longest reply (default: 64)")
    soak.add_argument(
        "--warmup", type=int, default=20,
        help="replies after which resident memory must stay within 5%% of its warm-up peak (default: 20)",
    )
    soak.add_argument(
        "--score-replies", action="store_true",
        help="score every reply by its target's NLL per token and its longest loop (a stretch repeating itself), and "
        "check the caches after it; fail on a method whose replies score worse than plain decoding's on either "
        "(a test with a 0.001 false-alarm rate), one reply far past plain decoding's worst (garbage), or a cache "
        "that differs from a fresh forward",
    )
    soak.add_argument(
        "--reference-replies", type=int, default=0,
        help="plain-decoding replies to run after the others, as the garbage check's reference (default: 0)",
    )
    soak.add_argument(
        "--auto-every", type=int, default=0,
        help="make every Nth reply `auto`, the others rotating over the rest (default: 0, all rotate)",
    )
    soak.add_argument("--json", type=Path, dest="json_out", help="write the figures here")
    soak.set_defaults(run=_run_soak)

    gui_bench = commands.add_parser(
        "gui-bench", help="send prompts through the desktop app's real window and through the engine alone, and "
        "compare: the app's tok/s against the engine's, the window thread's CPU share, the longest wait between updates",
    )
    _add_pair_arguments(gui_bench)
    gui_bench.add_argument("--prompts", type=Path, help="JSON Lines file with a \"prompt\" key per line (default: shipped set)")
    gui_bench.add_argument("--limit", type=int, default=4, help="use only the first N prompts (default: 4)")
    gui_bench.add_argument(
        "--methods", default="default",
        help="comma-separated methods; default = the method the app decodes the pair with (default: default)",
    )
    gui_bench.add_argument(
        "--temperature", type=float, default=CHAT_DEFAULT_TEMPERATURE,
        help=f"0 is greedy (default: {CHAT_DEFAULT_TEMPERATURE:g}, the app's)",
    )
    gui_bench.add_argument("--max-new-tokens", type=int, default=256, help="longest reply (default: 256)")
    gui_bench.add_argument(
        "--one-conversation", action="store_true",
        help="send a method's prompts into one chat, as a user writes one (both paths get the earlier turns); "
        "default: each prompt in a new chat",
    )
    gui_bench.add_argument("--json", type=Path, dest="json_out", help="write the figures here")
    gui_bench.set_defaults(run=_run_gui_bench)

    add_distill_command(commands)
    add_ngram_table_command(commands)
    add_export_gguf_command(commands)
    add_calibrate_command(commands)
    add_tune_command(commands)
    return parser


class _PrintReport(argparse.Action):
    """--version and --paths in the full parser, so that --help lists them; main() answers
    them before building it. Prints and exits, as --help does."""

    def __init__(self, option_strings, dest, report, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.report = report

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.report())
        parser.exit()


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", default="demo", help="a pair name (demo, or one saved in the app) or a pair JSON file")
    parser.add_argument("--target", help="instead of --pair: a target model (folder, .gguf file or repo id)")
    parser.add_argument("--draft", help="with --target: a draft model (default: n-gram prompt lookup)")
    parser.add_argument(
        "--eagle", metavar="HEAD",
        help="an EAGLE-3 head for the target (a folder or Hugging Face repo id in the public EAGLE-3 layout): "
        "methods eagle and eagle-tree draft with it",
    )
    parser.add_argument("--precision", choices=PRECISIONS, help="target precision (default: auto)")
    parser.add_argument("--device", choices=DEVICES, help="device for both models (default: auto)")
    parser.add_argument(
        "--runtime", choices=RUNTIMES,
        help="what runs the models: llama.cpp (GGUF files), torch, or auto = llama.cpp wherever a model "
        "has a GGUF file and llama-cpp-python is installed (default: the pair's setting, auto)",
    )


def _add_decoding_arguments(
    parser: argparse.ArgumentParser, default_max_new_tokens: int = 512, default_temperature: float | None = None
) -> None:
    """The decoding knobs; unless told otherwise they default as DecodeSettings does (greedy),
    which is what the bench measures at."""
    defaults = DecodeSettings()
    temperature = defaults.temperature if default_temperature is None else default_temperature
    parser.add_argument(
        "--method", choices=methods.NAMES,
        help="default: auto, the fastest exact method measured on this machine (plain decoding where drafting does not pay)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=default_max_new_tokens)
    parser.add_argument(
        "--temperature", type=float, default=temperature,
        help=f"0 is greedy: always the most likely token (default: {temperature:g})",
    )
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--draft-tokens", "-k", type=int, default=defaults.draft_tokens, help="K draft tokens per round")
    parser.add_argument(
        "--verifier", choices=("exact",) + VERIFIERS + ("sprinter",), default="exact",
        help="exact (block verification), token (exact, token-level), or sprinter: SPRINTER's learned "
        "verifier lets tokens out without the target checking them; faster, APPROXIMATE; needs tandem calibrate (default: exact)",
    )
    parser.add_argument(
        "--tree-shape", default=defaults.tree_shape,
        help="tree and staged: auto (chosen from measurements) or BUDGETxDEPTH, e.g. 16x4 (default: auto)",
    )
    parser.add_argument("--seed", type=int)


def _rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated probabilities, e.g. 0.8,0.64,0.51,0.41; got {text!r}") from None


def _pair_from_args(args: argparse.Namespace) -> PairConfig:
    from .pairs import find_pair

    if args.target:
        target = ModelSpec(args.target, args.precision or "auto", args.device or "auto")
        draft = ModelSpec(args.draft, "auto", args.device or "auto") if args.draft else None
        return PairConfig(name="command line", target=target, draft=draft, runtime=args.runtime or "auto", eagle=args.eagle)
    pair = find_pair(args.pair)
    if args.eagle:
        pair = dataclasses.replace(pair, eagle=args.eagle)
    if args.precision or args.device:
        target = ModelSpec(pair.target.source, args.precision or pair.target.precision, args.device or pair.target.device)
        pair = dataclasses.replace(pair, target=target)
    if args.runtime:
        pair = dataclasses.replace(pair, runtime=args.runtime)
    return pair


def _settings_from_args(args: argparse.Namespace, offered_methods: tuple[str, ...]) -> DecodeSettings:
    mode = methods.SPRINTER_MODE if args.verifier == methods.SPRINTER_MODE else methods.EXACT_MODE
    if mode == methods.SPRINTER_MODE and args.method not in (None, methods.SPRINTER_MODE):
        raise ConfigError("--verifier sprinter decodes with SPRINTER's own rounds; leave out --method")
    return DecodeSettings(
        method=methods.method_for_mode(args.method or methods.default_method(offered_methods), mode),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        draft_tokens=args.draft_tokens,
        verifier=args.verifier if args.verifier in VERIFIERS else DecodeSettings().verifier,
        seed=args.seed,
        tree_shape=args.tree_shape,
    )


def _load(pair: PairConfig):
    from .session import load_pair

    def report(message: str, fraction: float | None) -> None:
        print(f"  {message}", file=sys.stderr)

    return load_pair(pair, report)


def _run_chat(args: argparse.Namespace) -> int:
    from .terminal_chat import TerminalChat

    _settings_from_args(args, methods.NAMES)  # bad settings fail before a load that can take minutes
    pair = _load(_pair_from_args(args))
    return TerminalChat(pair, _settings_from_args(args, pair.methods), args.system).run()


@contextlib.contextmanager
def _profiled(top: int):
    """cProfile around the block; prints the `top` functions by own time (0: no profiling)."""
    if not top:
        yield
        return
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(top)


def _run_bench(args: argparse.Namespace) -> int:
    from .prompts import prompts_file, read_prompts_and_kinds
    from .tools import llama_server
    from .tools.bench import (
        ALL_METHODS, DEFAULT_ALIAS, Bench, ServerPeer, available_methods, format_table, machine_description, parse_methods,
        resolve_default,
    )
    from .tools.costs import CostTable, measure_costs

    settings = _settings_from_args(args, methods.NAMES)  # the bench sets the method of each run itself
    settings = settings.with_changes(synthetic_acceptance=args.synthetic_acceptance)
    chosen = parse_methods(args.methods, ALL_METHODS + (DEFAULT_ALIAS,))
    entries = read_prompts_and_kinds(prompts_file(args.prompts))
    if args.kind:
        wanted = {kind.strip() for kind in args.kind.split(",") if kind.strip()}
        known = {kind for _, kind in entries}
        if not wanted <= known:
            raise ConfigError(f"no prompts of kind {sorted(wanted - known)[0]!r}; the file has {', '.join(sorted(known - {''})) or 'no kinds'}")
        entries = [(prompt, kind) for prompt, kind in entries if kind in wanted]
    if args.limit:
        entries = entries[: args.limit]
    prompts, kinds = [prompt for prompt, _ in entries], [kind for _, kind in entries]
    cost_table = CostTable.load(args.cost_table) if args.cost_table else None  # a bad file fails before the load
    for given, what in ((args.llama_server_draft, "draft"), (args.llama_server_target, "target")):
        if given is not None and not given.is_file():
            raise ConfigError(f"no {what} GGUF at {given}")
    server = ServerPeer(llama_server.find_binary(args.llama_server), args.llama_server_draft, args.llama_server_target)
    pair = _load(_pair_from_args(args))
    if pair.has_background_work:
        # The bench times the runtime a user has once the compile is done, not the compile.
        print("  compiling the forwards before timing them (minutes the first time; TANDEM_COMPILE=0 skips it)…", file=sys.stderr)
        started = time.perf_counter()
        pair.wait_for_background_work()
        print(f"  runtime: {pair.runtime_label} (waited {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    chosen = available_methods(pair, server) if args.methods.strip() == "all" else resolve_default(chosen, pair)
    if args.record_costs:
        print("  measuring what a call costs on this machine…", file=sys.stderr)
        recorded = measure_costs(pair, machine_description(pair).get("gpu") or machine_description(pair)["processor"])
        args.record_costs.write_text(json.dumps(recorded.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"cost table written to {args.record_costs}", file=sys.stderr)
    bench = Bench(pair, settings, cost_table, server)
    with _profiled(args.profile):
        report = bench.run(prompts, chosen, progress=lambda line: print(line, file=sys.stderr), kinds=kinds)
    print(format_table(report))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"report written to {args.json_out}", file=sys.stderr)
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    from .model_files import check_pair_files
    from .serve.command import serve
    from .serve.limits import ServerLimits

    limits = ServerLimits(max_tokens=args.max_tokens_limit, max_waiting=args.max_waiting)
    config = _pair_from_args(args)
    check_pair_files(config)  # a missing or broken model file is said before the server starts
    return serve(config, args.host, args.port, args.api_key, limits)


def _run_soak(args: argparse.Namespace) -> int:
    # The soak drives the app's worker thread and chat store, so it needs Qt: loaded only here,
    # as for the desktop app.
    app_soak = importlib.import_module("app.soak")
    return app_soak.command(
        _pair_from_args(args), args.replies, args.max_new_tokens, args.warmup, args.json_out,
        args.score_replies, args.reference_replies, args.auto_every,
    )


def _run_gui_bench(args: argparse.Namespace) -> int:
    # The window needs Qt: loaded only here, as for the desktop app and the soak.
    from .prompts import prompts_file, read_prompts

    app_gui_bench = importlib.import_module("app.gui_bench")
    prompts = read_prompts(prompts_file(args.prompts))[: args.limit or None]
    names = [name.strip() for name in args.methods.split(",") if name.strip()]
    unknown = [name for name in names if name not in methods.NAMES + (app_gui_bench.DEFAULT_ALIAS,)]
    if unknown or not names:
        raise ConfigError(f"unknown method {unknown[0]!r}" if unknown else "no method given")
    settings = DecodeSettings(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    return app_gui_bench.command(
        _pair_from_args(args), prompts, names, settings, args.json_out, one_conversation=args.one_conversation
    )
