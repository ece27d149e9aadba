"""``text_classifier``: text in, ``{label: probability}`` over all classes out (``ts.torch_handler.text_classifier``).

The model is TorchServe's AG_NEWS shape, ``forward(text, offsets)`` over an ``nn.EmbeddingBag``: token
ids of the whole batch concatenated, ``offsets`` marking where each request starts. Unlike TorchServe's
("No batching supported"), every request of the batch is classified, in one model call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from servetune.handlers.metrics import timed
from servetune.handlers.text import TextHandler, ngrams_iterator
from servetune.handlers.util import BadInputError, map_class_to_label

__all__ = ["TextClassifier"]


class TextClassifier(TextHandler):
    """Clean up (HTML, case, contractions, accents, punctuation), tokenize, add bigrams, look up, classify."""

    ngrams = 2

    def tokens_of(self, row: Any) -> list[str]:
        text = self.text_of(row)
        text = self._remove_html_tags(text)
        text = text.lower()
        text = self._expand_contractions(text)
        text = self._remove_accented_characters(text)
        text = self._remove_punctuation(text)
        tokens = self._tokenize(text)
        if not tokens:
            raise BadInputError("body has no words once HTML, accents and punctuation are removed")
        return tokens

    def preprocess_item(self, row: Any) -> torch.Tensor:
        tokens = self.tokens_of(row)
        ids = [self.source_vocab.get(token, self.unknown_index) for token in ngrams_iterator(tokens, self.ngrams)]
        return torch.as_tensor(ids, dtype=torch.long)

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        """``(token ids of all accepted requests, offsets)``, or None when every request was rejected."""
        texts = self.preprocess_each(data, self.preprocess_item)
        if not texts:
            return None
        lengths = torch.as_tensor([0] + [len(t) for t in texts[:-1]], dtype=torch.long)
        return torch.cat(texts).to(self.device), torch.cumsum(lengths, dim=0).to(self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        text, offsets = data
        with torch.inference_mode():
            return self.model(text, offsets, *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> list[dict[str, Any]]:
        return map_class_to_label(F.softmax(data, dim=1).tolist(), self.mapping)
