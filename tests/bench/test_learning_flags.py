"""bench/learning.py's learner-field flags: --learner (every method) and --variant (one more A-RIDE arm), parsed and
refused by name (no services: parsing fails before any starts)."""

from __future__ import annotations

import argparse
import re
import sys

import pytest

from bench import learning


def test_learner_fields_parse_as_json_where_they_can() -> None:
    parsed = learning.parse_learner_fields("policy_lr=1e-4,retrace_lambda=0,algorithm=digirl")
    assert parsed == {"policy_lr": 1e-4, "retrace_lambda": 0, "algorithm": "digirl"}


def test_a_variant_is_a_name_and_learner_fields() -> None:
    assert learning.parse_variant("lr1e-4:policy_lr=1e-4") == ("lr1e-4", {"policy_lr": 1e-4})


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (learning.parse_learner_fields, "policy_lr", r"'policy_lr': expected FIELD=VALUE with a \[learner\] field"),
        (learning.parse_learner_fields, "no_such_field=1", r"'no_such_field=1': expected FIELD=VALUE"),
        (learning.parse_learner_fields, ",", r"',': expected FIELD=VALUE,…"),
        (learning.parse_variant, "lr1e-4", r"'lr1e-4': expected NAME:FIELD=VALUE,…"),
        (learning.parse_variant, "lr 1:policy_lr=1", r"'lr 1': a variant's NAME takes letters"),
    ],
)
def test_malformed_fields_are_refused_naming_them(parse: object, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)  # type: ignore[operator]


def test_the_learner_flag_refuses_an_unknown_field_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["learning.py", "--out", "unused.json", "--learner", "polcy_lr=1e-4"])
    with pytest.raises(SystemExit):
        learning.main()
    assert "argument --learner: 'polcy_lr=1e-4': expected FIELD=VALUE with a [learner] field" in capsys.readouterr().err


def test_learner_changes_apply_over_the_profile_and_leave_it_alone() -> None:
    changed = learning.with_learner_changes(learning.LEARNER, {"policy_lr": 1e-4})
    assert changed == {**learning.LEARNER, "policy_lr": 1e-4} and learning.LEARNER["policy_lr"] == 3e-4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": 3}, "--learner: seed is set by --seed"),
        ({"algorithm": "digirl"}, "--learner: algorithm is set by --methods, --variant"),
        ({"dtype": "bf16"}, "--learner: dtype is set by --precision"),
        ({"policy_lr": -1}, "--learner: learner.policy_lr: Input should be greater than 0 (got -1)"),
    ],
)
def test_learner_changes_to_a_field_set_elsewhere_or_to_a_bad_value_are_refused(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(SystemExit, match=re.escape(message)):
        learning.with_learner_changes(learning.LEARNER, changes)
