"""The garbage check of a stored `tandem soak --score-replies --json` report, judged again by
today's rule: `python -m app.soak_rejudge docs/bench/soak-*.json`.

A report keeps each reply's index, method and score, not its prompt: the prompt is the one
`tandem soak` asks at that index, of the chat prompts in turn (app/soak.py's SoakDriver).
The texts of the replies it listed are kept, and shown again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.prompts import CHAT_PROMPTS, read_prompts

from .soak_scoring import ScoredReply, judge, verdict_lines


def stored_replies(report: dict, prompts: list[str]) -> list[ScoredReply]:
    """A report's replies as the garbage check reads them."""
    texts = {listed["index"]: listed["text"] for key in ("above", "looping") for listed in report["garbage"].get(key, [])}
    return [
        ScoredReply(reply["index"], reply["method"], prompts[reply["index"] % len(prompts)], texts.get(reply["index"], ""), reply["score"])
        for reply in report["replies"]
    ]


def main(paths: list[str]) -> int:
    """Prints each report's garbage check, then and now; 0 when every one passes now."""
    prompts = read_prompts(CHAT_PROMPTS)
    passed_all = True
    for path in paths:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        if not report.get("garbage"):
            print(f"{path}: its replies were not scored (a soak without --score-replies)")
            continue
        then = next((check for check in report["checks"] if check["name"] == "garbage"), None)
        passed, detail, lines = verdict_lines(judge(stored_replies(report, prompts)))
        passed_all &= passed
        print(f"{path}: {len(report['replies'])} replies")
        if then is not None:
            print(f"  then: {'pass' if then['passed'] else 'FAIL'} {then['detail']}")
        print(f"  now:  {'pass' if passed else 'FAIL'} {detail}")
        print("\n".join(lines))
    return 0 if passed_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
