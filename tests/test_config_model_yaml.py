"""``servetune.config.model_yaml``: what a model-config.yaml may hold, in process (the server's answers are in
test_server_config_limits.py)."""

from __future__ import annotations

import math

import pytest

from models import CHAIN, LAUGHS
from servetune._exceptions import ConfigError
from servetune.config.model_yaml import MAX_MODEL_CONFIG_BYTES, load_model_yaml


def load(text: str) -> dict[str, object]:
    return load_model_yaml(text.encode(), where="m.mar: model-config.yaml")


def test_json_data_comes_out_as_it_went_in_with_aliases_expanded() -> None:
    data = load(
        "minWorkers: 1\nbase: &b {t: 0.5, tags: [a, b]}\nhandler:\n  <<: *b\n  top: 3\n  again: *b\n"
        "nums: [1, -2, 2.5, .nan, .inf, null, true, 'x']\npairs: !!omap [{a: 1}, {b: 2}]\n"
    )
    assert data["handler"] == {"t": 0.5, "tags": ["a", "b"], "top": 3, "again": {"t": 0.5, "tags": ["a", "b"]}}
    handler = data["handler"]
    assert isinstance(handler, dict) and handler["again"] is not data["base"], "aliases are copied, not shared"
    nums = data["nums"]
    assert isinstance(nums, list) and math.isnan(nums[3]) and nums[4] == math.inf and nums[5:] == [None, True, "x"]
    assert data["pairs"] == [["a", 1], ["b", 2]]
    assert load("") == {} and load("# nothing\n") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:\n  b: [1, 2021-03-04 05:06:07]\n", "key 'a.b[1]': 2021-03-04T05:06:07 is a YAML date"),
        ("? [1, 2]\n: x\n", "invalid YAML"),  # a list as a key: unhashable in Python
        ("true: 1\n", "key True at the top level: mapping keys must be strings"),
        ("a: &x {b: *x}\n", "key 'a.b': the value contains itself"),
        ("- 1\n", "expected a mapping at the top level, got list"),
        ("a: [1\n", "invalid YAML"),
        ("a: !!python/object:os.system x\n", "invalid YAML"),
        (LAUGHS, "more than 50 aliases of lists or mappings (line 7)"),
        (CHAIN, "expands to more than 65536 bytes as JSON (the file is 437 bytes"),
        ("s: &s '" + "y" * 40_000 + "'\nt: *s\n", "expands to more than 65536 bytes as JSON"),
        ("a: '" + "z" * MAX_MODEL_CONFIG_BYTES + "'\n", f"more than the limit of {MAX_MODEL_CONFIG_BYTES} bytes"),
    ],
    ids=[
        "datetime",
        "list-key",
        "bool-key",
        "self-mapping",
        "top-list",
        "syntax",
        "python-tag",
        "laughs",
        "chain",
        "aliased-string",
        "large",
    ],
)
def test_what_json_cannot_carry_is_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(text)
    assert str(refused.value).startswith("m.mar: model-config.yaml: ") and message in str(refused.value)


def test_fifty_aliases_and_fifty_levels_are_allowed() -> None:
    aliases = "a: &a [x]\nb: [" + ", ".join(["*a"] * 50) + "]\n"
    assert len(load(aliases)["b"]) == 50  # type: ignore[arg-type]
    deep = "a: " + "[" * 49 + "]" * 49 + "\n"  # 49 lists in the top-level mapping: 50 levels
    nested = load(deep)["a"]
    for _ in range(48):
        assert isinstance(nested, list)
        nested = nested[0]
    assert nested == []
    with pytest.raises(ConfigError, match="nested more than 50 levels deep"):
        load("a: " + "[" * 50 + "]" * 50 + "\n")
    with pytest.raises(ConfigError, match="more than 50 aliases"):
        load(aliases.replace("*a]", "*a, *a]"))
