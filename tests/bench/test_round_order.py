"""The order of the systems in a bench round: rotated, so no system always follows another."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from astrai_batch.bench.numerics_pairs import round_order


@given(
    names=st.lists(st.text(min_size=1, max_size=4), unique=True, max_size=6),
    start=st.integers(min_value=0, max_value=50),
)
def test_rounds_as_many_as_names_put_each_name_once_in_each_place(names, start):
    rounds = [round_order(names, start + k) for k in range(len(names))]
    for order in rounds:
        assert sorted(order) == sorted(names)
    for place in range(len(names)):
        assert sorted(order[place] for order in rounds) == sorted(names)


def test_round_one_keeps_the_order_given_and_each_round_moves_it_by_one():
    names = ("default", "float32", "fast", "llama-cpp")
    assert round_order(names, 0) == names
    assert round_order(names, 1) == ("float32", "fast", "llama-cpp", "default")
    assert round_order(names, 5) == round_order(names, 1)
    assert round_order((), 3) == ()
