"""Typed records: numpy tensors, timestamps, and that every record matches its Avro schema field for field."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

from distrl_stream.events import EVENT_TYPES, Step, Tensor, default_store, epoch_ms, from_epoch_ms, utc_now
from distrl_stream.testing.samples import sample_trajectory


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64", "float16", "bool", "uint8"])
def test_tensor_round_trips_numpy_arrays_of_each_dtype(dtype: str) -> None:
    array = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    tensor = Tensor.from_numpy(array)
    assert tensor.dtype == dtype
    assert tensor.shape == (2, 3, 4)
    back = tensor.to_numpy()
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


def test_tensor_stores_little_endian_c_order_whatever_the_input_layout() -> None:
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    fortran = np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3))
    expected = np.arange(6, dtype="<i4").tobytes()
    assert Tensor.from_numpy(big_endian).data == expected
    assert Tensor.from_numpy(fortran).data == expected
    np.testing.assert_array_equal(Tensor.from_numpy(big_endian).to_numpy(), np.arange(6).reshape(2, 3))


def test_tensor_of_a_scalar_has_empty_shape() -> None:
    tensor = Tensor.from_numpy(np.float32(1.5))
    assert tensor.shape == ()
    assert tensor.to_numpy() == np.float32(1.5)


def test_tensor_shape_given_as_list_equals_the_tuple_form() -> None:
    assert Tensor(data=b"", dtype="int32", shape=[0]) == Tensor(data=b"", dtype="int32", shape=(0,))


def test_records_are_frozen() -> None:
    step = sample_trajectory(random.Random(0), steps=1).steps[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.reward = 1.0  # type: ignore[misc]


def test_utc_now_is_aware_and_millisecond_precise() -> None:
    now = utc_now()
    assert now.tzinfo is UTC
    assert now.microsecond % 1000 == 0


def test_epoch_ms_round_trips_and_rejects_naive_datetimes() -> None:
    moment = datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=timezone(timedelta(hours=2)))
    assert from_epoch_ms(epoch_ms(moment)) == moment
    assert epoch_ms(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1000
    with pytest.raises(ValueError, match="naive"):
        epoch_ms(datetime(2025, 1, 1))


def _avro_fields(schema: dict) -> list[str]:
    return [f["name"] for f in schema["fields"]]


@pytest.mark.parametrize("cls", [*EVENT_TYPES, Step, Tensor], ids=lambda c: c.__name__)
def test_record_fields_match_the_current_schema_in_order(cls: type) -> None:
    store = default_store()
    top = store.latest(getattr(cls, "AVRO_NAME", "distrl.TrajectoryEvent")).schema
    schema = top
    if cls is Step:
        schema = next(f for f in top["fields"] if f["name"] == "steps")["type"]["items"]
    elif cls is Tensor:
        step = next(f for f in top["fields"] if f["name"] == "steps")["type"]["items"]
        schema = next(f for f in step["fields"] if f["name"] == "token_ids")["type"]
    assert [f.name for f in dataclasses.fields(cls)] == _avro_fields(schema)
