"""The option list the Airflow operator checks DAGs against (`airflow/run_options`): equal to
`astrai-batch run`'s own, and checked as the CLI would (no Airflow needed here; the operator
itself runs under a real Airflow in `test_example_dag`)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from astrai_batch.airflow.run_options import (
    OptionError,
    check_options,
    command_arguments,
    load_spec,
    spec_of_command,
)
from astrai_batch.cli import main, run

SPEC = load_spec()


def test_the_list_is_the_cli_s() -> None:
    """Regenerate with: python -c 'import json; from astrai_batch.cli import run; from
    astrai_batch.airflow.run_options import *; SPEC_PATH.write_text(json.dumps(
    spec_of_command(run), indent=1, sort_keys=True) + "\\n")'"""
    assert spec_of_command(run) == SPEC


def test_importing_the_package_needs_no_airflow_and_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import astrai_batch.airflow, astrai_batch.airflow.run_options; "
        "print(sorted(m for m in ('airflow', 'torch', 'click') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_token": 4}, "unknown option 'max_token' (did you mean 'max_tokens'?)"),
        ({"output": "x"}, "unknown option 'output'"),
        ({"max_tokens": "many"}, "option 'max_tokens' must be an integer, got 'many'"),
        ({"temperature": True}, "option 'temperature' must be a number, got True"),
        ({"task": "summarize"}, "option 'task' must be one of generate, score, embed"),
        ({"fast_numerics": "yes"}, "option 'fast_numerics' must be true or false"),
        ({"max_tokens": 4, "max-tokens": 5}, "option 'max_tokens' is given twice"),
    ],
)
def test_refusals(options, message) -> None:
    with pytest.raises(OptionError) as error:
        check_options(options, SPEC, rendered=False)
    assert message in str(error.value)


def test_templates_wait_for_rendering() -> None:
    options = {"max_tokens": "{{ params.n }}", "model": "{{ var.value.model }}"}
    assert check_options(options, SPEC, rendered=False) == options
    with pytest.raises(OptionError, match="'max_tokens' must be an integer, got 'lots'"):
        check_options({"max_tokens": "lots"}, SPEC, rendered=True)
    assert check_options({"max_tokens": "64"}, SPEC, rendered=True) == {"max_tokens": "64"}


def test_arguments_parse_as_the_cli_parses_them() -> None:
    options = check_options(
        {
            "max-tokens": 8,
            "temperature": 0.5,
            "stop": ["\n", "END"],
            "lora": "a=/adapters/a",
            "prefix_cache": False,
            "fast_numerics": True,
            "save_tokens": False,
            "task": "generate",
            "max_errors": 0.05,
            "seed": None,
        },
        SPEC,
        rendered=True,
    )
    arguments = command_arguments(options, SPEC)
    assert arguments == [
        "--max-tokens", "8", "--temperature", "0.5", "--stop", "\n", "--stop", "END",
        "--lora", "a=/adapters/a", "--no-prefix-cache", "--fast-numerics", "--task",
        "generate", "--max-errors", "0.05",
    ]  # fmt: skip
    # click accepts every one of them (parsing only: the command is not invoked)
    context = run.make_context("run", ["in.jsonl", "out.parquet", *arguments])
    params = context.params
    assert params["max_tokens"] == 8 and params["stop"] == ("\n", "END")
    assert params["prefix_cache"] is False and params["fast_numerics"] is True
    assert CliRunner().invoke(main, ["run", "--help"]).exit_code == 0
