"""``scores.npz`` as `uqbench.files.rundir.write_scores` writes it: numpy reads back every array
as it was given, and the same arrays are the same bytes whenever they are written."""
from __future__ import annotations

import time

import numpy as np

from uqbench.files.rundir import SCORES, write_scores


def test_scores_read_back_as_written_and_are_the_same_bytes_each_time(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"m/g/msp|d|id|uncertainty": rng.random((50, 2)),
              "m/g|d|id|labels": rng.integers(0, 4, (50, 2)),
              "m/g/msp|pooled|id|correct": (rng.random((50, 2)) > 0.5).astype(float),
              "empty": np.zeros((0, 3)), "text": np.array(["a", "bc"])}
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    first = write_scores(tmp_path / "a", arrays)
    time.sleep(1.1)   # a zip member dated when it was written would differ now
    second = write_scores(tmp_path / "b", arrays)
    assert first == tmp_path / "a" / SCORES and first.read_bytes() == second.read_bytes()
    with np.load(first) as z:
        assert z.files == list(arrays)
        for k, a in arrays.items():
            assert z[k].dtype == a.dtype and z[k].shape == a.shape
            np.testing.assert_array_equal(z[k], a)
