"""The cache key: sha256 of canonical JSON; equal requests share a key, any real difference splits.

Seed task 1 (`test_salt_changes_key`): a cache key without the salt replayed epoch 1's answers in
epoch 2, so the gate compared a candidate against stale samples.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trm_llm.cache import CacheKeyError, build_cache_key, check_key

MSGS = [{"role": "user", "content": "x"}]


def test_key_is_sha256_of_canonical_json() -> None:
    expected_payload = {
        "v": 1,
        "endpoint": "http://h/v1",
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "params": {"temperature": 0.5},
        "salt": "run:e1",
    }
    canonical = json.dumps(expected_payload, sort_keys=True, separators=(",", ":"))
    key = build_cache_key(
        "m", MSGS, "run:e1", {"temperature": 0.5, "stream": True}, endpoint="http://h/v1"
    )
    assert key == hashlib.sha256(canonical.encode()).hexdigest()


def test_salt_changes_key() -> None:
    k_none = build_cache_key("m", MSGS, None)
    k_e1 = build_cache_key("m", MSGS, "run:e1")
    k_e2 = build_cache_key("m", MSGS, "run:e2")
    assert len({k_none, k_e1, k_e2, build_cache_key("m", MSGS, "")}) == 4
    assert build_cache_key("m", MSGS) == k_none  # an unsalted call keeps the unsalted key
    assert build_cache_key("m", MSGS, "run:e1") == k_e1  # a resumed epoch still hits


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields_are_keyed(field: str) -> None:
    turn = {"role": "assistant", "content": "4"}
    plain = build_cache_key("m", [*MSGS, turn])
    with_reasoning = build_cache_key("m", [*MSGS, {**turn, field: "2+2"}])
    other_reasoning = build_cache_key("m", [*MSGS, {**turn, field: "3+1"}])
    assert len({plain, with_reasoning, other_reasoning}) == 3


@pytest.mark.parametrize(
    "transport",
    [
        {"stream": True},
        {"stream": False, "stream_options": {"include_usage": True}},
        {"timeout": 30.0, "request_timeout": 5},
        {"extra_headers": {"X-Title": "trm"}, "extra_query": {"a": "b"}},
    ],
)
def test_transport_fields_do_not_change_key(transport: dict[str, Any]) -> None:
    params = {"temperature": 0.7, "max_tokens": 64}
    assert build_cache_key("m", MSGS, params=params) == build_cache_key(
        "m", MSGS, params={**params, **transport}
    )


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7},
        {"top_p": 0.9},
        {"max_tokens": 64},
        {"seed": 1},
        {"stop": ["\n"]},
        {"reasoning_effort": "high"},  # not listed anywhere: unknown params are keyed
    ],
)
def test_generation_params_change_key(params: dict[str, Any]) -> None:
    assert build_cache_key("m", MSGS, params=params) != build_cache_key("m", MSGS)


def test_every_other_input_changes_key() -> None:
    base = build_cache_key("m", MSGS, endpoint="http://a/v1")
    assert build_cache_key("m2", MSGS, endpoint="http://a/v1") != base
    assert build_cache_key("m", MSGS, endpoint="http://b/v1") != base
    assert build_cache_key("m", [{"role": "user", "content": "y"}], endpoint="http://a/v1") != base
    assert (
        build_cache_key("m", [{"role": "system", "content": "x"}], endpoint="http://a/v1") != base
    )


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"temperature": None}, {}),
        ({"stop": "\n"}, {"stop": ["\n"]}),
        ({"temperature": 1}, {"temperature": 1.0}),
        ({"stop": ("a", "b")}, {"stop": ["a", "b"]}),
        ({"top_p": 0.9, "seed": 3}, {"seed": 3, "top_p": 0.9}),
    ],
)
def test_equivalent_params_share_a_key(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert build_cache_key("m", MSGS, params=left) == build_cache_key("m", MSGS, params=right)


def test_bool_is_not_a_number() -> None:
    assert build_cache_key("m", MSGS, params={"logprobs": True}) != build_cache_key(
        "m", MSGS, params={"logprobs": 1}
    )


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("m", MSGS, None, {"temperature": float("nan")}), {}),
        (("m", MSGS, None, {"temperature": float("inf")}), {}),
        (("m", [{"role": "user", "content": object()}]), {}),
        (("m", [{1: "x"}]), {}),
        (("m", ["not a mapping"]), {}),
        (("m", "a string is not a list of messages"), {}),
        (("m", MSGS, None, {"model": "other"}), {}),
        (("m", MSGS, None, {"messages": []}), {}),
        (("", MSGS), {}),
        (("m", MSGS, 3), {}),
        (("m", MSGS), {"endpoint": None}),
    ],
)
def test_unkeyable_input_is_refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(CacheKeyError):
        build_cache_key(*args, **kwargs)


def test_check_key_refuses_anything_but_a_digest() -> None:
    key = build_cache_key("m", MSGS)
    assert check_key(key) == key
    for bad in ["user: what is 2+2?", key.upper(), key[:-1], key + "0", ""]:
        with pytest.raises(CacheKeyError):
            check_key(bad)


# --- property: keys are equal exactly when the normalised inputs are equal --------------------

TRANSPORT = ["stream", "stream_options", "timeout", "request_timeout"]
GENERATION = ["temperature", "top_p", "seed", "stop", "max_tokens", "custom_knob"]
TEXT = st.sampled_from(["x", "y"])
VALUES = st.sampled_from(
    [None, 0, 0.0, 1, 1.0, 0.5, True, False, "s", ["s"], ("s",), [], {"a": 1}, {"a": 1.5}]
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": TEXT},
    optional={"reasoning_content": TEXT, "reasoning": TEXT},
)
REQUEST = st.fixed_dictionaries(
    {
        "endpoint": st.sampled_from(["", "http://a/v1"]),
        "model": st.sampled_from(["m1", "m2"]),
        "messages": st.lists(MESSAGE, max_size=2),
        "params": st.dictionaries(st.sampled_from(GENERATION + TRANSPORT), VALUES, max_size=3),
        "salt": st.sampled_from([None, "", "run:e1", "run:e2"]),
    }
)
TRANSPORT_NOISE = st.dictionaries(st.sampled_from(TRANSPORT), VALUES, max_size=2)


def _typed(value: Any) -> Any:
    """Value identity as the key must see it: bool apart from numbers, 1 == 1.0, tuple == list."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", float(value))
    if isinstance(value, list | tuple):
        return ("list", tuple(_typed(v) for v in value))
    return ("dict", tuple(sorted((k, _typed(v)) for k, v in value.items())))


def _normal_form(request: dict[str, Any]) -> tuple[Any, ...]:
    params = {}
    for name, value in request["params"].items():
        if name in TRANSPORT or value is None:
            continue
        params[name] = _typed([value] if name == "stop" and isinstance(value, str) else value)
    return (request["endpoint"], request["model"], request["messages"], params, request["salt"])


def _key(request: dict[str, Any]) -> str:
    return build_cache_key(
        request["model"],
        request["messages"],
        request["salt"],
        request["params"],
        endpoint=request["endpoint"],
    )


def _twin(value: Any) -> Any:
    """A look-alike of `value` that may or may not be the same request (1 vs 1.0, "s" vs ["s"])."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value) if isinstance(value, int) else int(value)
    if isinstance(value, str):
        return [value]
    return tuple(value) if isinstance(value, list) else value


@st.composite
def request_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request and a near neighbour: most parts shared, params edited a value at a time."""
    first: dict[str, Any] = draw(REQUEST)
    fresh: dict[str, Any] = draw(REQUEST)
    second = {part: draw(st.sampled_from([first[part]] * 3 + [fresh[part]])) for part in first}
    params: dict[str, Any] = {}
    for name, value in second["params"].items():
        action = draw(st.sampled_from(["keep", "twin", "replace", "drop"]))
        if action == "keep":
            params[name] = value
        elif action == "twin":
            params[name] = _twin(value)
        elif action == "replace":
            params[name] = draw(VALUES)
    second["params"] = {**params, **draw(TRANSPORT_NOISE)}
    return first, second


@settings(max_examples=400, deadline=None)
@given(request_pairs())
@example(
    (
        {"endpoint": "", "model": "m1", "messages": [], "params": {}, "salt": "run:e1"},
        {"endpoint": "", "model": "m1", "messages": [], "params": {}, "salt": "run:e2"},
    )
)
@example(
    (
        {"endpoint": "", "model": "m1", "messages": [], "params": {"stop": "s"}, "salt": None},
        {"endpoint": "", "model": "m1", "messages": [], "params": {"stop": ["s"]}, "salt": None},
    )
)
def test_keys_differ_exactly_when_inputs_differ(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    first, second = pair
    assert (_key(first) == _key(second)) == (_normal_form(first) == _normal_form(second))
