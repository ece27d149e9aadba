"""BenchSpec validation (errors name the key and the value) and the warm-up syntax."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune import ConfigError
from servetune.bench import BenchSpec, parse_warmup

URL = "http://127.0.0.1:8080/predictions/resnet-18"


def test_modes_and_model_name() -> None:
    closed = BenchSpec(url=URL, concurrency=4, requests=10)
    assert (closed.mode, closed.clients, closed.model) == ("closed", 4, "resnet-18")
    opened = BenchSpec(url=URL + "/2.0", rate=50.0, duration=2.0, arrival="poisson")
    assert (opened.mode, opened.model) == ("open", "resnet-18")
    assert BenchSpec(url="http://h:1/ping", requests=1).model is None
    assert BenchSpec(url=URL, duration=1.0).clients == 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"url": "ftp://x/y", "requests": 1}, "url="),
        ({"url": URL}, "requests=None and duration=None"),
        ({"url": URL, "requests": 0}, "requests=0"),
        ({"url": URL, "requests": 1.5}, "requests=1.5"),
        ({"url": URL, "duration": -1.0}, "duration=-1.0"),
        ({"url": URL, "duration": 1.0, "rate": 0.0}, "rate=0.0"),
        ({"url": URL, "duration": 1.0, "rate": float("inf")}, "rate=inf"),
        ({"url": URL, "duration": 1.0, "rate": 5.0, "concurrency": 2}, "give one"),
        ({"url": URL, "duration": 1.0, "arrival": "bursty"}, "arrival='bursty'"),
        ({"url": URL, "requests": 1, "warmup_requests": -1}, "warmup_requests=-1"),
        ({"url": URL, "requests": 1, "warmup_requests": 5, "warmup_seconds": 1.0}, "both set"),
        ({"url": URL, "requests": 1, "metrics_url": "localhost:8082"}, "metrics_url="),
        ({"url": URL, "requests": 1, "method": "DELETE"}, "method='DELETE'"),
    ],
)
def test_invalid_specs_name_the_key(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace("[", r"\[")):
        BenchSpec(**kwargs)  # type: ignore[arg-type]


def test_parse_warmup() -> None:
    assert parse_warmup("0") == (0, 0.0)
    assert parse_warmup("100") == (100, 0.0)
    assert parse_warmup("5s") == (0, 5.0)
    assert parse_warmup("2.5 seconds") == (0, 2.5)
    assert parse_warmup("20 requests") == (20, 0.0)
    for bad in ("abc", "1.5", "-3", "5m"):
        with pytest.raises(ConfigError, match="warmup="):
            parse_warmup(bad)


def test_spec_is_frozen(tmp_path: Path) -> None:
    spec = BenchSpec(url=URL, requests=1, input=tmp_path)
    with pytest.raises(AttributeError):
        spec.requests = 2  # type: ignore[misc]
