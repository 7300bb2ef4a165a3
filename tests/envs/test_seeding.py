"""Text-derived seeds: fixed values, independent of the process's hash randomisation."""

from __future__ import annotations

import os
import subprocess
import sys

from distrl_stream.envs.seeding import stable_int


def test_stable_int_is_the_same_in_every_process() -> None:
    code = "from distrl_stream.envs.seeding import stable_int; print(stable_int('0:c0'))"
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert int(out) == stable_int("0:c0") == 477700525


def test_stable_int_fits_in_31_bits_and_tells_texts_apart() -> None:
    values = {stable_int(f"steps:{i}") for i in range(1000)}
    assert len(values) == 1000
    assert all(0 <= v < 2**31 for v in values)
