"""`tandem export-gguf`: the command over the two writers, a Llama model or draft
(`export_gguf.py`) and an EAGLE-3 head (`gguf_eagle3.py`, which builds on the first)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..runtime.eagle3_head import is_eagle3_folder
from ..runtime.llamacpp_pairing import speculation_refusals
from .export_gguf import DEFAULT_PRECISION, DISTILLED_TARGET, PRECISIONS, export_gguf
from .gguf_draft_for_target import paired_target_gguf
from .gguf_eagle3 import export_eagle3_gguf


def add_export_gguf_command(subparsers: Any) -> None:
    """Register `export-gguf` on the `tandem` command's subparsers."""
    parser = subparsers.add_parser(
        "export-gguf",
        help="write a Llama-architecture model folder as a GGUF file for llama.cpp",
        description="Export a Hugging Face Llama model folder (config.json, safetensors, a BPE "
        "tokenizer.json) to one GGUF file that llama.cpp runs with the same logits. An EAGLE-3 "
        "head's folder is written as llama.cpp's eagle3 draft for its target (--spec-type draft-eagle3).",
    )
    parser.add_argument("folder", type=Path, help="the model folder")
    parser.add_argument(
        "--out", type=Path,
        help="the GGUF file to write (default: FOLDER/model.PRECISION.gguf; with --draft-for, "
        "FOLDER-for-TARGET.PRECISION.gguf in the current folder)",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
        help=f"tensor type of the matrices; norms stay f32 (default: {DEFAULT_PRECISION})",
    )
    parser.add_argument(
        "--draft-for", nargs="?", const=DISTILLED_TARGET, metavar="TARGET",
        help="write a draft for llama.cpp's speculative decoding (llama-server -md, LM Studio) with "
        "TARGET, a GGUF file or demo-target: its tokenizer and a row for each of its tokens "
        "(default TARGET: the one the draft was distilled from; an EAGLE-3 head is always "
        "written for a target, by default that one)",
    )
    parser.set_defaults(run=run_export_gguf)


def run_export_gguf(args: argparse.Namespace) -> int:
    folder = Path(args.folder).expanduser()
    eagle3 = is_eagle3_folder(folder)
    target = None
    if args.draft_for is not None or eagle3:  # an EAGLE-3 head drafts only from its target's features
        target = paired_target_gguf(folder, args.draft_for or None)
    if eagle3:
        path = export_eagle3_gguf(folder, target, args.out, args.precision)
    else:
        path = export_gguf(folder, args.out, args.precision, draft_for=target)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {args.precision})")
    if target is not None:
        return _report_pairing(target, path, "draft-eagle3" if eagle3 else "draft-simple")
    return 0


def _report_pairing(target: Path, draft: Path, spec_type: str) -> int:
    """Ask llama.cpp, where it is installed, whether its speculative decoding takes the draft."""
    try:
        refusals = speculation_refusals(target, draft)
    except ImportError:
        refusals = None
    except ValueError as error:  # this llama.cpp cannot load one of the files
        refusals = [str(error)]
    if refusals:
        print(f"llama.cpp would refuse it as the draft of {target}: {refusals[0]}", file=sys.stderr)
        return 1
    checked = "llama.cpp accepts it" if refusals is not None else "not checked (llama-cpp-python is not installed)"
    print(f"a draft for {target}, {checked}; run the pair with: llama-server -m {target} -md {draft} --spec-type {spec_type}")
    return 0
