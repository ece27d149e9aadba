"""benchmarks/request_stages.py marks exact lines of a copy of the source: every one of them must still be there."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _request_stages():
    spec = importlib.util.spec_from_file_location("request_stages", ROOT / "benchmarks" / "request_stages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_request_stages_benchmark_marks_every_stage_in_this_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ first: not for other tests
    stages = _request_stages()
    copy = stages.marked_copy(ROOT / "src", tmp_path / "src")  # SystemExit when a line to mark moved
    marked: list[str] = []
    for path in sorted((copy / "servetune").rglob("*.py")):  # every file given marks (and the import of them)
        text = path.read_text()
        if stages.IMPORT not in text:
            assert not re.findall(r"mark\('(\w+)'\)", text)  # a mark without its import
            continue
        compile(text, str(path), "exec")  # the copy still parses
        marked += re.findall(r"mark\('(\w+)'\)", text)
    assert sorted(marked) == sorted(stages.ORDER)  # each stage once, none missing
    assert "dump()" in (copy / "servetune" / "server" / "worker.py").read_text()
    # the tree itself is untouched
    assert "mark(" not in (ROOT / "src" / "servetune" / "server" / "worker.py").read_text()
