"""The job-spec pieces the jobs depend on: `upgrade_spec` (stored specs stay readable) and
`train.optimizer` (the correctness gate's SGD runs)."""

from __future__ import annotations

import pytest

from jobs.spec import SPEC_VERSION, SpecError, parse_spec, to_dict, upgrade_spec


def test_upgrade_spec_keeps_a_current_spec_and_does_not_mutate_it():
    stored = to_dict(parse_spec({"preset": "zero2"}))
    before = to_dict(parse_spec({"preset": "zero2"}))
    up = upgrade_spec(stored)
    assert up == before and up is not stored
    assert stored == before  # the caller's dict is untouched
    assert parse_spec(up) == parse_spec(stored)


def test_upgrade_spec_without_version_is_current():
    assert upgrade_spec({"name": "old"}).get("version", SPEC_VERSION) == SPEC_VERSION
    assert parse_spec({"name": "old", "parallel": {"dp": 2}}).version == SPEC_VERSION


def test_future_version_refused_naming_the_field():
    with pytest.raises(SpecError) as e:
        parse_spec({"version": SPEC_VERSION + 1, "parallel": {"dp": 2}})
    assert e.value.errors[0]["loc"] == ["version"]


def test_old_stored_spec_without_optimizer_reads_as_adam():
    stored = to_dict(parse_spec({"preset": "ddp"}))
    del stored["train"]["optimizer"]  # written before the field existed
    assert parse_spec(upgrade_spec(stored)).train.optimizer == "adam"


def test_optimizer_field_is_validated_by_name():
    with pytest.raises(SpecError) as e:
        parse_spec({"parallel": {"dp": 2}, "train": {"optimizer": "lamb"}})
    assert e.value.errors[0]["loc"] == ["train", "optimizer"]
    assert "adam, sgd" in e.value.errors[0]["msg"]
