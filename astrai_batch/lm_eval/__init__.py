"""lm-evaluation-harness on our engine: the model name ``astrai-batch``.

    import astrai_batch.lm_eval  # registers "astrai-batch" with lm-eval's model registry
    lm_eval.simple_evaluate(model="astrai-batch", model_args="model=smollm2-135m", tasks=[...])

or from the shell: ``python -m astrai_batch.lm_eval --model astrai-batch --tasks ...`` (lm-eval's
own command line with the name registered). `pyproject.toml` also declares the class under the
``lm_eval.models`` entry-point group, which lm-eval releases that read it find without an
import. The class is `backend.AstraiBatchLM`; docs/lm-eval.md says what it promises.
"""

from __future__ import annotations

try:
    import lm_eval  # noqa: F401  (the real package, not this one: absolute import)
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "astrai_batch.lm_eval needs lm-eval: pip install 'astrai-batch[lm-eval]'"
    ) from error

from astrai_batch.lm_eval.backend import AstraiBatchLM

__all__ = ["AstraiBatchLM"]
