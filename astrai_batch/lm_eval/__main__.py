"""`python -m astrai_batch.lm_eval ARGS`: lm-eval's command line with `astrai-batch` registered
(lm-eval 0.4.13 does not read the `lm_eval.models` entry points itself)."""

from __future__ import annotations

import astrai_batch.lm_eval  # noqa: F401  (registers the model name)


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
