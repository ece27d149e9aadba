"""text_classifier and the text clean-up/tokenizer it uses, on a tiny EmbeddingBag model."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from servetune._exceptions import HandlerError
from servetune.handlers import InputParam, Request, Service, load_service, uninstall_ts_alias
from servetune.handlers.text import basic_english_tokenize, ngrams_iterator
from servetune.handlers.text_classifier import TextClassifier

MODEL_SOURCE = """
import torch

CALLS = []

class TextNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(12, 6)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, text, offsets):
        CALLS.append(offsets.numel())
        return self.fc(self.embedding(text, offsets))
"""

VOCAB = {
    "<unk>": 0,
    "the": 1,
    "market": 2,
    "rallied": 3,
    "team": 4,
    "won": 5,
    "is": 6,
    "not": 7,
    "it": 8,
    "the market": 9,
    "team won": 10,
    "cafe": 11,
}
LABELS = {"0": "World", "1": "Sports", "2": "Business", "3": "Sci/Tec"}


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # load_service puts the model dir on sys.path and installs the ts alias: undo both for other tests
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    uninstall_ts_alias()


def reference() -> torch.nn.Module:
    namespace: dict[str, Any] = {}
    exec(MODEL_SOURCE, namespace)
    torch.manual_seed(0)
    return namespace["TextNet"]().eval()


def load(tmp_path: Path, vocab_file: str = "source_vocab.pt") -> Service:
    (tmp_path / "model.py").write_text(MODEL_SOURCE)
    torch.save(reference().state_dict(), tmp_path / "weights.pth")
    (tmp_path / "index_to_name.json").write_text(json.dumps(LABELS))
    if vocab_file.endswith(".pt"):
        torch.save(VOCAB, tmp_path / vocab_file)
    else:
        (tmp_path / vocab_file).write_text(json.dumps(VOCAB))
    manifest = {
        "model": {
            "modelName": "news",
            "modelVersion": "1",
            "handler": "text_classifier",
            "serializedFile": "weights.pth",
            "modelFile": "model.py",
        }
    }
    return load_service(
        model_dir=tmp_path, manifest=manifest, model_name="news", gpu_id=None, batch_size=4, model_yaml_config={}
    )


def text_request(text: str | bytes, request_id: str = "r", content_type: str = "text/plain") -> Request:
    data = text.encode() if isinstance(text, str) else text
    return Request(request_id, {}, [InputParam("body", content_type, data)])


def expected(ids: list[int]) -> dict[str, float]:
    with torch.no_grad():
        logits = reference()(torch.tensor(ids), torch.tensor([0]))
    return {LABELS[str(i)]: p for i, p in enumerate(torch.softmax(logits, dim=1)[0].tolist())}


def test_tokenizer_and_ngrams() -> None:
    assert basic_english_tokenize('The "Market", (rallied)! Why?') == [
        "the",
        "market",
        ",",
        "(",
        "rallied",
        ")",
        "!",
        "why",
        "?",
    ]
    assert list(ngrams_iterator(["a", "b", "c"], 2)) == ["a", "b", "c", "a b", "b c"]
    assert list(ngrams_iterator(["a", "b", "c"], 3))[-1] == "a b c"


def test_cleanup_steps() -> None:
    handler = TextClassifier()
    assert (
        handler._expand_contractions("it's fine, we're sure it isn’t John's")
        == "it is fine, we are sure it is not Johns"
    )
    assert handler._remove_html_tags("<b>bold</b> &amp; more") == "bold  more"
    assert handler._remove_accented_characters("café") == "cafe"
    assert handler._remove_punctuation("a.b,c!") == "abc"


@pytest.mark.parametrize("vocab_file", ["source_vocab.pt", "source_vocab.json"])
def test_batch_classified_in_one_call_with_bad_item_rejected(tmp_path: Path, vocab_file: str) -> None:
    service = load(tmp_path, vocab_file)
    out = service.predict(
        [
            text_request("<p>The market rallied!</p>", "a"),
            text_request("   ", "b"),
            text_request(b"\xff\xfe", "c", content_type="application/octet-stream"),
            text_request("It isn't: the TEAM won. Café", "d"),
        ]
    )
    assert [r.status for r in out] == [200, 400, 400, 200]
    assert json.loads(out[1].body)["message"] == "request b: body is empty"
    assert json.loads(out[2].body)["message"].startswith("request c: body is not UTF-8 text")
    # "the market rallied" + bigrams; unknown bigrams map to <unk>
    assert json.loads(out[0].body) == pytest.approx(expected([1, 2, 3, 9, 0]))
    # "it is not the team won cafe" + bigrams ("team won" is known)
    assert json.loads(out[3].body) == pytest.approx(expected([8, 6, 7, 1, 4, 5, 11, 0, 0, 0, 0, 10, 0]))
    assert sys.modules["model"].CALLS == [2]


def test_punctuation_only_text_is_rejected(tmp_path: Path) -> None:
    (out,) = load(tmp_path).predict([text_request("?!...")])
    assert out.status == 400 and "has no words" in json.loads(out.body)["message"]


def test_json_string_body_accepted(tmp_path: Path) -> None:
    (out,) = load(tmp_path).predict([text_request('"the team won"', content_type="application/json")])
    assert json.loads(out.body) == pytest.approx(expected([1, 4, 5, 0, 10]))


def test_missing_or_unreadable_vocab(tmp_path: Path) -> None:
    service_dir = tmp_path / "a"
    service_dir.mkdir()
    load(service_dir)
    (service_dir / "source_vocab.pt").unlink()
    manifest = {"model": {"handler": "text_classifier", "serializedFile": "weights.pth", "modelFile": "model.py"}}
    with pytest.raises(HandlerError, match="Missing the source_vocab file"):
        load_service(
            model_dir=service_dir, manifest=manifest, model_name="n", gpu_id=None, batch_size=1, model_yaml_config={}
        )
    (service_dir / "source_vocab.json").write_text(json.dumps({"a": "not an index"}))
    with pytest.raises(HandlerError, match="token -> int index"):
        load_service(
            model_dir=service_dir, manifest=manifest, model_name="n", gpu_id=None, batch_size=1, model_yaml_config={}
        )
