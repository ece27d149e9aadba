"""``TextHandler``: text clean-up, tokenizer and vocabulary for text handlers (``ts.torch_handler.text_handler``).

TorchServe used torchtext (now discontinued) for its ``basic_english`` tokenizer, its n-grams and a pickled
``Vocab`` in ``source_vocab.pt``. servetune has its own tokenizer with the same rules and reads the
vocabulary as a plain mapping ``token -> index``: ``source_vocab.pt`` (``torch.save`` of a dict, or of a
list of tokens) or ``source_vocab.json``. Convert an old torchtext vocab once with
``torch.save(dict(vocab.get_stoi()), "source_vocab.pt")``. Unknown tokens map to ``<unk>`` (else 0).
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from abc import ABC
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from servetune.handlers.base import BaseHandler
from servetune.handlers.context import Context
from servetune.handlers.util import BadInputError, request_input

__all__ = ["TextHandler", "basic_english_tokenize", "ngrams_iterator"]

_HTML = re.compile(r"<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
_WHOLE_WORDS = {"won't": "will not", "can't": "cannot", "shan't": "shall not", "ain't": "is not", "let's": "let us"}
_SUFFIXES = {"n't": " not", "'re": " are", "'ll": " will", "'ve": " have", "'m": " am", "'d": " would"}
_IS_WORDS = {"he", "she", "it", "that", "there", "here", "what", "where", "who", "how", "when", "why"}
_CONTRACTION = re.compile(r"\b([a-z]+)(n't|'re|'ll|'ve|'m|'d|'s)\b", re.IGNORECASE)
_SPACED = re.compile(r"([.,()!?])")


def basic_english_tokenize(text: str) -> list[str]:
    """Lower-case, split off ``. , ( ) ! ?`` and ``'``, drop ``"``, ``;`` and ``:``, split on white space."""
    text = text.lower().replace("<br />", " ").replace('"', "")
    text = _SPACED.sub(r" \1 ", text.replace("'", " ' "))
    return text.replace(";", " ").replace(":", " ").split()


def ngrams_iterator(tokens: list[str], ngrams: int) -> Iterator[str]:
    """The tokens, then every run of 2..``ngrams`` consecutive tokens joined by a space."""
    yield from tokens
    for n in range(2, ngrams + 1):
        for start in range(len(tokens) - n + 1):
            yield " ".join(tokens[start : start + n])


class TextHandler(BaseHandler, ABC):
    """Loads ``source_vocab`` and offers TorchServe's text clean-up steps."""

    def __init__(self) -> None:
        super().__init__()
        self.source_vocab: dict[str, int] = {}
        self.unknown_index = 0

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        self.source_vocab = self._load_vocab(self.get_source_vocab_path(context))
        self.unknown_index = self.source_vocab.get("<unk>", 0)

    def get_source_vocab_path(self, context: Context) -> Path:
        model_dir = Path(context.system_properties["model_dir"])
        named = ((self.manifest or {}).get("model") or {}).get("sourceVocab")
        candidates = [model_dir / named] if named else [model_dir / "source_vocab.pt", model_dir / "source_vocab.json"]
        for path in candidates:
            if path.is_file():
                return path
        raise FileNotFoundError(
            "Missing the source_vocab file (source_vocab.pt or source_vocab.json, a mapping token -> index) in "
            f"{model_dir}; see docs/handlers.md"
        )

    @staticmethod
    def _load_vocab(path: Path) -> dict[str, int]:
        if path.suffix == ".json":
            vocab = json.loads(path.read_text(encoding="utf-8"))
        else:
            try:
                vocab = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # e.g. a pickled torchtext Vocab
                raise ValueError(
                    f"{path.name} is not a plain token -> index mapping ({exc}); convert a torchtext vocab with "
                    'torch.save(dict(vocab.get_stoi()), "source_vocab.pt")'
                ) from exc
        if isinstance(vocab, list):
            vocab = {str(token): i for i, token in enumerate(vocab)}
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise ValueError(f"{path.name} must hold a mapping token -> int index or a list of tokens")
        return {str(token): int(index) for token, index in vocab.items()}

    def text_of(self, row: Any) -> str:
        """The request's text; ``BadInputError`` when it is missing, empty, not UTF-8 or not text."""
        name = "data" if isinstance(row, dict) and row.get("data") else "body"
        text = request_input(row)
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadInputError(f"{name} is not UTF-8 text ({exc})") from exc
        if not isinstance(text, str):
            kind = "missing" if text is None else f"a JSON {type(text).__name__}"
            raise BadInputError(f"{name} must be text, got {kind}")
        if not text.strip():
            raise BadInputError(f"{name} is empty")
        return text

    def _remove_html_tags(self, text: str) -> str:
        return _HTML.sub("", text)

    def _expand_contractions(self, text: str) -> str:
        text = text.replace("\u2019", "'")
        for word, expansion in _WHOLE_WORDS.items():
            text = re.sub(rf"\b{re.escape(word)}\b", expansion, text, flags=re.IGNORECASE)

        def expand(match: re.Match[str]) -> str:
            stem, suffix = match.group(1), match.group(2).lower()
            if suffix == "'s":
                return f"{stem} is" if stem.lower() in _IS_WORDS else match.group(0)
            return stem + _SUFFIXES[suffix]

        return _CONTRACTION.sub(expand, text).replace("'", "")

    def _remove_accented_characters(self, text: str) -> str:
        return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("utf-8", "ignore")

    def _remove_punctuation(self, text: str) -> str:
        return text.translate(str.maketrans("", "", string.punctuation))

    _remove_puncutation = _remove_punctuation  # TorchServe's misspelt name, kept for subclasses that call it

    def _tokenize(self, text: str) -> list[str]:
        return basic_english_tokenize(text)

    def get_word_token(self, input_tokens: list[str]) -> list[str]:
        return [token.replace("\u0120", "") for token in input_tokens]
