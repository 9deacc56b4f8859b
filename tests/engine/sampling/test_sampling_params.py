from __future__ import annotations

import subprocess
import sys

import pytest

from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.errors import ConfigError


def test_defaults_are_greedy_and_valid() -> None:
    params = SamplingParams()
    assert params.greedy
    assert params.n == 1
    assert params.max_tokens == 256
    assert params.stop == ()
    assert not SamplingParams(temperature=0.7).greedy


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n": 0}, "n must be >= 1, got 0"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"min_tokens": -1}, "min_tokens must be >= 0, got -1"),
        ({"max_tokens": 5, "min_tokens": 6}, "min_tokens must be <= max_tokens (5), got 6"),
        ({"temperature": -1.0}, "temperature must be >= 0, got -1.0"),
        ({"temperature": float("inf")}, "temperature must be finite, got inf"),
        ({"temperature": float("nan")}, "temperature must be finite, got nan"),
        ({"top_k": -1}, "top_k must be >= 0, got -1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"min_p": -0.1}, "min_p must be in [0, 1], got -0.1"),
        ({"min_p": 1.01}, "min_p must be in [0, 1], got 1.01"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0, got 0.0"),
        ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2], got 2.5"),
        ({"frequency_penalty": -3}, "frequency_penalty must be in [-2, 2], got -3.0"),
        ({"seed": -1}, "seed must be in [0, 2**63), got -1"),
        ({"seed": 2**63}, "seed must be in [0, 2**63), got 9223372036854775808"),
        ({"stop": ("ok", "")}, "stop[1] is empty"),
        ({"stop": (3,)}, "stop[0] must be a string, got integer"),
        ({"stop": 3}, "stop must be a string or a list of strings, got integer"),
        ({"stop": {"a": 1}}, "stop must be a string or a list of strings, got object"),
        ({"stop_token_ids": (1, -2)}, "stop_token_ids[1] must be a non-negative integer, got -2"),
        (
            {"stop_token_ids": (True,)},
            "stop_token_ids[0] must be a non-negative integer, got boolean",
        ),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list of integers, got integer"),
        ({"n": True}, "n must be an integer, got boolean"),
        ({"max_tokens": 2.0}, "max_tokens must be an integer, got number"),
        ({"seed": False}, "seed must be an integer, got boolean"),
        ({"top_k": "5"}, "top_k must be an integer, got string"),
        ({"temperature": True}, "temperature must be a number, got boolean"),
        ({"top_p": "0.9"}, "top_p must be a number, got string"),
        ({"ignore_eos": 1}, "ignore_eos must be a boolean, got integer"),
        ({"logprobs": None}, "logprobs must be a boolean, got null"),
    ],
)
def test_invalid_values_name_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SamplingParams(**overrides)
    assert str(raised.value) == message


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        SamplingParams(n=0)


def test_boundary_values_are_accepted() -> None:
    params = SamplingParams(
        top_p=1.0,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        seed=2**63 - 1,
        min_tokens=256,
        top_k=1,
    )
    assert params.seed == 2**63 - 1


def test_ints_are_accepted_for_float_fields_and_stored_as_floats() -> None:
    params = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert params.temperature == 1.0
    assert type(params.temperature) is float
    assert type(params.top_p) is float
    assert type(params.repetition_penalty) is float
    assert params == SamplingParams(temperature=1.0, top_p=1.0, repetition_penalty=2.0)


def test_from_dict_rejects_unknown_keys_sorted() -> None:
    with pytest.raises(ConfigError) as raised:
        SamplingParams.from_dict({"temperature": 0.5, "foo": 1, "bar": 2})
    assert str(raised.value) == "unknown sampling field(s): bar, foo"


def test_from_dict_rejects_a_non_mapping() -> None:
    with pytest.raises(ConfigError) as raised:
        SamplingParams.from_dict([("n", 2)])  # type: ignore[arg-type]
    assert str(raised.value) == "sampling params must be an object, got list"


def test_from_dict_coerces_lists_to_tuples() -> None:
    params = SamplingParams.from_dict(
        {"stop": ["\n\n", "END"], "stop_token_ids": [7, 9], "temperature": 1, "seed": 3}
    )
    assert params.stop == ("\n\n", "END")
    assert params.stop_token_ids == (7, 9)
    assert params.temperature == 1.0
    assert params.seed == 3


def test_from_dict_accepts_a_single_stop_string() -> None:
    assert SamplingParams.from_dict({"stop": "###"}).stop == ("###",)


def test_lists_are_stored_as_tuples() -> None:
    params = SamplingParams(stop=["a"], stop_token_ids=[3])  # type: ignore[arg-type]
    assert (params.stop, params.stop_token_ids) == (("a",), (3,))
    assert params == SamplingParams(stop=("a",), stop_token_ids=(3,))


def test_from_dict_type_checks() -> None:
    with pytest.raises(ConfigError) as raised:
        SamplingParams.from_dict({"max_tokens": True})
    assert str(raised.value) == "max_tokens must be an integer, got boolean"
    with pytest.raises(ConfigError) as raised:
        SamplingParams.from_dict({"stop_token_ids": "12"})
    assert str(raised.value) == "stop_token_ids must be a list of integers, got string"


def test_from_dict_of_empty_mapping_is_the_default() -> None:
    assert SamplingParams.from_dict({}) == SamplingParams()


def test_to_dict_round_trips() -> None:
    params = SamplingParams(
        n=3, temperature=0.8, top_k=40, stop=("a", "b"), stop_token_ids=(5,), seed=11
    )
    as_dict = params.to_dict()
    assert as_dict["stop"] == ["a", "b"]
    assert as_dict["stop_token_ids"] == [5]
    assert SamplingParams.from_dict(as_dict) == params


def test_replace_validates_and_coerces() -> None:
    params = SamplingParams(temperature=0.5)
    changed = params.replace(top_p=0.9, stop=["x"])
    assert changed.top_p == 0.9
    assert changed.stop == ("x",)
    assert changed.temperature == 0.5
    assert params.top_p == 1.0
    with pytest.raises(ConfigError) as raised:
        params.replace(top_p=0)
    assert str(raised.value) == "top_p must be in (0, 1], got 0.0"
    with pytest.raises(ConfigError) as raised:
        params.replace(temprature=1.0)
    assert str(raised.value) == "unknown sampling field(s): temprature"


def test_params_are_hashable_and_frozen() -> None:
    params = SamplingParams(stop=("a",))
    assert hash(params) == hash(SamplingParams(stop=("a",)))
    with pytest.raises(AttributeError):
        params.n = 2  # type: ignore[misc]


def test_module_does_not_import_torch() -> None:
    code = "import sys; import astrai_batch.engine.sampling.params; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
