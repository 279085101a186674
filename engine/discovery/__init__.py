"""Models already on this machine: found in LM Studio's, Ollama's, GPT4All's and Jan's folders,
the Hugging Face cache and folders the user added, described from their headers, and for a
chosen target the drafts and EAGLE-3 heads that fit it. Nothing is copied.

- locations.py: where each app keeps its models;
- scan.py: each app's layout, walked (`discover`);
- found.py: one model described from its headers (`FoundModel`, `FoundHead`);
- gguf_header.py: a GGUF header read in milliseconds;
- drafts.py: the drafts, heads and methods a found target gets.
"""
from .drafts import DraftChoices, by_tokenizer, draft_choices, pair_methods, why_not
from .found import FoundHead, FoundModel
from .scan import Found, discover

__all__ = [
    "DraftChoices", "Found", "FoundHead", "FoundModel", "by_tokenizer", "discover", "draft_choices", "pair_methods", "why_not",
]
