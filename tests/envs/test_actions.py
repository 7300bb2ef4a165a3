"""The action space: strict parsing, canonical text, and the never-raises property."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl_stream.envs.actions import (
    MAX_ACTION_CHARS,
    Action,
    Click,
    Drag,
    InvalidAction,
    KeyboardEnter,
    LongPress,
    NavigateBack,
    NavigateHome,
    OpenApp,
    Scroll,
    Select,
    Status,
    TypeText,
    Wait,
    action_from_dict,
    canonicalize,
    parse_action,
)

# Text that may contain anything a JSON string can carry except what the parser rejects on purpose.
typable = st.text(
    st.characters(blacklist_categories=("Cc", "Cs")),
    min_size=1,
    max_size=50,
)
indices = st.integers(min_value=0, max_value=9999)
coords = st.integers(min_value=0, max_value=100_000)

actions: st.SearchStrategy[Action] = st.one_of(
    st.builds(Click, index=indices),
    st.builds(lambda x, y: Click(x=x, y=y), coords, coords),
    st.builds(LongPress, index=indices),
    st.builds(lambda x, y: LongPress(x=x, y=y), coords, coords),
    st.builds(TypeText, text=typable, index=st.none() | indices),
    st.builds(Scroll, direction=st.sampled_from(["up", "down", "left", "right"]), index=st.none() | indices),
    st.builds(Select, index=indices, text=typable),
    st.builds(lambda i, k: Select(i, option=k), indices, indices),
    st.builds(Drag, index=indices, target=indices).filter(lambda d: d.index != d.target),
    st.just(NavigateBack()),
    st.just(NavigateHome()),
    st.builds(OpenApp, app_name=typable),
    st.just(KeyboardEnter()),
    st.just(Wait()),
    st.builds(Status, goal_status=st.sampled_from(["complete", "infeasible"])),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(
    ["action_type", "index", "target", "x", "y", "text", "option", "direction", "app_name", "goal_status", "extra"]
)
kinds = st.sampled_from(["click", "type", "scroll", "select", "drag", "status", "open_app", "wait", "up", "complete"])


@given(st.text(max_size=300))
def test_any_text_parses_to_an_action_or_an_invalid_with_a_reason(text: str) -> None:
    result = parse_action(text)
    if isinstance(result, InvalidAction):
        assert result.reason
    else:
        assert parse_action(result.to_text()) == result


@given(st.dictionaries(keys, json_values | kinds, max_size=5))
def test_any_json_object_parses_to_an_action_or_an_invalid(obj: dict) -> None:
    for result in (parse_action(json.dumps(obj)), action_from_dict(obj)):
        if isinstance(result, InvalidAction):
            assert result.reason
        else:
            assert parse_action(result.to_text()) == result


@given(json_values)
def test_any_json_document_never_raises(value: object) -> None:
    assert parse_action(json.dumps(value)) is not None


@settings(max_examples=300)
@given(actions)
def test_canonical_text_round_trips_and_matches_compact_json(action: Action) -> None:
    text = action.to_text()
    assert parse_action(text) == action
    assert text == json.dumps(action.to_dict(), separators=(",", ":"), ensure_ascii=False)
    assert text.startswith('{"action_type":"')


@given(actions)
def test_any_spelling_of_an_action_canonicalizes_to_the_same_text(action: Action) -> None:
    spaced = json.dumps(dict(reversed(list(action.to_dict().items()))), indent=2)
    assert canonicalize(f"  {spaced}\n") == action.to_text()


def test_canonical_key_order_is_fixed() -> None:
    assert TypeText(text="Ana", index=2).to_text() == '{"action_type":"type","index":2,"text":"Ana"}'
    assert Click(x=5, y=7).to_text() == '{"action_type":"click","x":5,"y":7}'
    assert Status("complete").to_text() == '{"action_type":"status","goal_status":"complete"}'
    assert Select(3, text="Blue").to_text() == '{"action_type":"select","index":3,"text":"Blue"}'
    assert Select(3, option=0).to_text() == '{"action_type":"select","index":3,"option":0}'
    assert Drag(1, 4).to_text() == '{"action_type":"drag","index":1,"target":4}'


def test_androidworld_aliases_render_under_our_names() -> None:
    assert parse_action('{"action_type":"input_text","text":"hi"}') == TypeText(text="hi")
    assert parse_action('{"action_type":"tap","index":1}') == Click(index=1)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty action text"),
        ("click 3", "not valid JSON"),
        ('Action: {"action_type":"wait"}', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"index": 3}', "missing key 'action_type'"),
        ('{"action_type": "fly"}', "unknown action_type 'fly'"),
        ('{"action_type": "click"}', "click needs 'index' or 'x' and 'y'"),
        ('{"action_type": "click", "x": 3}', "click needs both 'x' and 'y'"),
        ('{"action_type": "click", "index": 1, "x": 3, "y": 4}', "either 'index' or 'x' and 'y'"),
        ('{"action_type": "click", "index": true}', "'index' must be an integer, got bool"),
        ('{"action_type": "click", "index": 2.0}', "'index' must be an integer, got 2.0"),
        ('{"action_type": "click", "index": -1}', "'index' must be in 0..9999"),
        ('{"action_type": "click", "index": 1, "index": 2}', "duplicate key 'index'"),
        ('{"action_type": "wait", "seconds": 2}', "wait does not take 'seconds'"),
        ('{"action_type": "type", "text": ""}', "'text' must not be empty"),
        ('{"action_type": "type", "text": "a\\u0000b"}', "control or surrogate character U+0000"),
        ('{"action_type": "type", "text": "\\ud800"}', "control or surrogate character U+D800"),
        ('{"action_type": "scroll", "direction": "sideways"}', "'direction' must be one of up, down, left, right"),
        ('{"action_type": "status", "goal_status": "done"}', "'goal_status' must be one of complete, infeasible"),
        ('{"action_type": "click", "x": NaN, "y": 1}', "NaN is not allowed"),
        ('{"action_type": "select", "text": "Blue"}', "select needs 'index'"),
        ('{"action_type": "select", "index": 1}', "either 'text' or 'option'"),
        ('{"action_type": "select", "index": 1, "text": "a", "option": 0}', "either 'text' or 'option'"),
        ('{"action_type": "select", "index": 1, "option": "0"}', "'option' must be an integer, got str"),
        ('{"action_type": "select", "index": 1, "text": "a", "x": 1}', "select does not take 'x'"),
        ('{"action_type": "drag", "index": 1}', "drag needs 'target'"),
        ('{"action_type": "drag", "target": 1}', "drag needs 'index'"),
        ('{"action_type": "drag", "index": 2, "target": 2}', "other than the dragged element"),
        ('{"action_type": "drag", "index": 1, "target": 2.0}', "'target' must be an integer"),
        ("[" * 100_000, f"longer than {MAX_ACTION_CHARS}"),
    ],
)
def test_invalid_text_names_the_first_problem(text: str, reason: str) -> None:
    result = parse_action(text)
    assert isinstance(result, InvalidAction)
    assert reason in result.reason
    assert result.raw == text[:MAX_ACTION_CHARS]


def test_deep_nesting_within_the_length_limit_is_invalid_not_a_crash() -> None:
    text = "[" * (MAX_ACTION_CHARS - 1)
    assert isinstance(parse_action(text), InvalidAction)


def test_non_text_input_is_invalid() -> None:
    assert isinstance(parse_action(b"{}"), InvalidAction)  # type: ignore[arg-type]
