"""``servetune.api.params``: management parameters as TorchServe's frontend reads them (the server's answers are in
test_server_config_limits.py and test_api_torchserve_management.py)."""

from __future__ import annotations

import pytest

from servetune._exceptions import ApiError
from servetune.api import params as p


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("10", 10),
        ("+10", 10),
        ("-3", -3),
        ("010", 10),
        ("0", 0),
        ("-0", 0),
        ("2147483647", 2**31 - 1),
        ("-2147483648", -(2**31)),
        ("0000000000000000000005", 5),
        # Integer.parseInt throws for each of these
        ("1_0", None),
        (" 1", None),
        ("1 ", None),
        ("2147483648", None),
        ("-2147483649", None),
        ("", None),
        ("+", None),
        ("-", None),
        ("0x10", None),
        ("1.0", None),
        ("1e3", None),
        ("²", None),
        ("9" * 400, None),
        ("1\n", None),
        # Java takes these (other scripts' decimal digits); servetune does not, on purpose
        ("\u0661\u0660", None),
        ("\uff11", None),
    ],
)
def test_java_int(raw: str, value: int | None) -> None:
    assert p.java_int(raw) == value


def test_register_and_scale_bounds_share_one_wording() -> None:
    with pytest.raises(ApiError) as refused:
        p.register_params({"url": "m.mar", "initial_workers": "3"}, 2)
    assert refused.value.message == "initial_workers must be between 0 and 2, got 3 (max_workers_per_model=2)"
    with pytest.raises(ApiError) as refused:
        p.scale_params({"min_worker": "-1"}, 2)
    assert refused.value.message == "min_worker must be between 0 and 2, got -1 (max_workers_per_model=2)"
    assert p.scale_params({"min_worker": "1_0", "max_worker": " 2"}, 2) == (1, 1)  # both "not given"
    assert p.register_params({"url": "m.mar", "batch_size": "1_0"}, 2).batch_size is None


def test_servetune_parameters_are_strict() -> None:
    with pytest.raises(ApiError, match="batch_size must be an integer, got '1_0'"):
        p.reconfigure_params({"batch_size": "1_0"})
    with pytest.raises(ApiError, match=r"num_threads must be between 0 and 1000000, got 9{24}\.\.\. \(30 characters\)"):
        p.reconfigure_params({"num_threads": "9" * 30})
    assert p.reconfigure_params({"batch_size": "+4"}).batch_size == 4
    with pytest.raises(ApiError, match=r"timeout must be between 1 and 1000000, got 9{24}\.\.\. \(400 characters\)"):
        p.scale_timeout({"timeout": "9" * 400})
    assert [p.scale_timeout({"timeout": t}) for t in ("-1", "0", "nan", "30")] == [None, None, None, 30]


@pytest.mark.parametrize("name", ["a/b", "a\nb", "\u202eab", ".a", "-a", "a b", "a:b", "é"])
def test_model_names_follow_the_archiver_rule(name: str) -> None:
    with pytest.raises(ApiError) as refused:
        p.register_params({"url": "m.mar", "model_name": name}, 2)
    assert refused.value.status == 400 and "invalid model name" in refused.value.message


def test_model_names_the_rule_accepts() -> None:
    for name in ("resnet-18", "a.b_c", "0model", "Z"):
        assert p.register_params({"url": "m.mar", "model_name": name}, 2).model_name == name
