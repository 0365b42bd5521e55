"""The `Outputs` record: bad fields named, available fields listed, select/concat round trips."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench import Outputs
from uqbench.core.outputs import PAD_LOGIT


def base(**kw):
    d = {"ids": np.arange(3).astype(str), "labels": np.array([0, 1, 2]),
         "logits": np.zeros((3, 3)), "domain": np.array(["x"] * 3)}
    d.update(kw)
    return d


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"logits": np.zeros(3)}, "logits must have shape"),
        ({"logits": np.zeros((3, 1))}, "logits must have shape"),
        ({"labels": np.array([0, 1])}, "labels must have shape"),
        ({"labels": np.array([0, 1, 3])}, r"labels must lie in \[0, 3\)"),
        ({"labels": np.array([0.0, 1.0, 2.0])}, "labels must be integers"),
        ({"logits": np.array([[0, np.nan, 0]] * 3)}, "logits has 3 NaN/inf"),
        ({"ids": np.arange(4).astype(str)}, "ids must have shape"),
        ({"route_entropy": np.ones(2)}, "route_entropy must have shape"),
        ({"disagreement": np.array([0, np.inf, 0])}, "disagreement has 1 NaN/inf"),
        ({"mc_logits": np.zeros((2, 3, 2))}, "mc_logits must have shape"),
        ({"member_logits": np.zeros((0, 3, 3))}, "member_logits must have shape"),
    ],
)
def test_bad_outputs_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        Outputs(**base(**kw))


def test_available_lists_present_fields():
    o = Outputs(**base(route_entropy=np.zeros(3)))
    assert o.available() == {"ids", "labels", "logits", "domain", "route_entropy"}


def test_select_and_concat_round_trip():
    o = make_outputs(n=6)
    a, b = o.select(o.domain == "a"), o.select(o.domain == "b")
    assert a.n + b.n == 6 and set(a.domain) == {"a"}
    back = Outputs.concat([a, b])
    order = np.concatenate([np.flatnonzero(o.domain == "a"), np.flatnonzero(o.domain == "b")])
    np.testing.assert_array_equal(back.logits, o.logits[order])
    np.testing.assert_array_equal(back.mc_logits, o.mc_logits[:, order])


def test_concat_pads_choices_with_zero_probability():
    two = Outputs(**base(logits=np.ones((3, 2)), labels=np.array([0, 1, 1])))
    four = make_outputs(n=2, c=4)
    pooled = Outputs.concat([two, four])
    assert pooled.logits.shape == (5, 4)
    assert np.all(pooled.logits[:3, 2:] == PAD_LOGIT)
    # a field missing in one part is dropped from the pooled record
    assert pooled.route_entropy is None and pooled.mc_logits is None
    from uqbench.core.probs import softmax
    assert np.all(softmax(pooled.logits)[:3, 2:] == 0.0)
