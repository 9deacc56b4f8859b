"""`AstraiBatchLM`: lm-eval's `TemplateLM` on our engine, in this process.

The model loads once (as `astrai-batch run` loads it: threads, dtype, LoRA adapters) and one
`EngineCore` serves every call, so its prefix cache carries few-shot contexts across
requests. Tokenization is lm-eval's own (`TemplateLM._encode_pair`, the hf backend's
`tok_encode` rule and left truncation), so the engine sees the token ids lm-eval's hf backend
feeds transformers.

`batch_size` is accepted and changes nothing: the engine batches by `max_num_seqs` and
`max_num_batched_tokens`, and with the default invariant numerics a request's results are
bitwise the same whatever runs beside it (lm-eval's hf backend moves in the last bits, and
sometimes an answer, with its batch size).
"""

from __future__ import annotations

import weakref
from typing import Any

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    _add_special_kwargs,
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from tqdm import tqdm

from astrai_batch.engine import keep_freed_memory, load_model, set_cpu_threads
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.types import GenerationRequest
from astrai_batch.jobs.job_adapters import load_job_adapters
from astrai_batch.lm_eval.engine_runs import (
    EvaluationError,
    run_to_completion,
    score_pairs,
    truncate_pair,
)
from astrai_batch.lm_eval.options import job_config, sampling_params

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's hf backend default


@register_model("astrai-batch")
class AstraiBatchLM(TemplateLM):
    """model_args are `astrai-batch run` option names (model, dtype, max_num_seqs, lora, ...);
    `batch_size`, `max_batch_size` and `device` (lm-eval's own arguments) are accepted."""

    def __init__(
        self,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        add_bos_token: bool | None = None,
        **model_args: Any,
    ) -> None:
        super().__init__()
        # results never depend on it (see the module docstring); kept for lm-eval's reports
        self.batch_size = batch_size
        self.max_batch_size = max_batch_size
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = add_bos_token
        config = job_config(model_args)
        self.config = config
        set_cpu_threads(config.threads)
        keep_freed_memory()
        self.loaded = load_model(config.model, **config.model_options())
        load_job_adapters(self.loaded, config)
        self.adapter = config.lora[0][0] if config.lora else None
        self.tokenizer = self.loaded.tokenizer
        self.core = EngineCore(self.loaded, EngineConfig(**config.engine_options()))
        self._device = config.device
        weakref.finalize(self, _close, self.core, self.loaded)

    # -- what lm-eval asks of a TemplateLM -----------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        # the hf backend's choice: the rolling windows and empty contexts start with it
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self.core.max_model_len

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        """The hf backend's rule: the tokenizer's own special tokens unless told, none when
        the text already starts with the BOS text."""
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(
            string, self.tokenizer.decode(self.prefix_token_id)
        ):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def _loglikelihood_tokens(
        self, requests: list, disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        pairs = [
            truncate_pair(context, continuation, self.max_length)
            for _, context, continuation in requests
        ]
        with tqdm(total=len(pairs), disable=disable_tqdm, desc="astrai-batch loglikelihood") as bar:
            scores = score_pairs(self.core, pairs, adapter=self.adapter, on_pair=bar.update)
        out = []
        for (key, _, _), score in zip(requests, scores, strict=True):
            answer = (score.logprob, score.is_greedy)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """lm-eval's rolling windows (`get_rolling_token_windows`, context_len 1, the first
        window conditioned on the prefix token), each window a pair; a document's sum."""
        windows: list[list] = []
        for (text,) in (request.args for request in requests):
            tokens = self.tok_encode(text)
            windows.append(
                [
                    (None, context, continuation)
                    for context, continuation in map(
                        lm_utils.make_disjoint_window,
                        lm_utils.get_rolling_token_windows(
                            token_list=tokens,
                            prefix_token=self.prefix_token_id,
                            max_seq_len=self.max_length,
                            context_len=1,
                        ),
                    )
                ]
            )
        flat = [window for document in windows for window in document]
        scores = iter(self._loglikelihood_tokens(flat, disable_tqdm=disable_tqdm))
        out = []
        for request, document in zip(requests, windows, strict=True):
            total = sum(next(scores)[0] for _ in document)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
            out.append(total)
        return out

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Each request decoded by the engine with lm-eval's stop rule: `until` plus the EOT
        text, the continuation decoded and cut before the first stop string."""
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        engine_requests = []
        stops = []
        for number, (context, gen_kwargs) in enumerate(request.args for request in requests):
            if not isinstance(gen_kwargs, dict):
                raise EvaluationError(f"gen_kwargs must be a dict, got {type(gen_kwargs).__name__}")
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            room = self.max_length - max_gen_toks
            if room <= 0:
                raise EvaluationError(
                    f"max_gen_toks {max_gen_toks} leaves no room for a context within "
                    f"{self.max_length} tokens"
                )
            prompt = self._generation_prompt(context)[-room:]
            params = sampling_params(
                kwargs,
                max_tokens=max_gen_toks,
                stop=[text for text in until if text != eos],
                stop_token_ids=(self.eot_token_id,),
            )
            engine_requests.append(
                GenerationRequest(number, prompt, params, seed_key=number, adapter=self.adapter)
            )
            stops.append(until)
        order = sorted(engine_requests, key=lambda r: tuple(r.prompt_token_ids))
        with tqdm(total=len(order), disable=disable_tqdm, desc="astrai-batch generate") as bar:
            results = run_to_completion(self.core, order, lambda _: bar.update())
        out = []
        for number, request in enumerate(requests):
            text = self.tok_decode(list(results[number][0].token_ids))
            text = postprocess_generated_text(text, stops[number], think_end_token=None)
            self.cache_hook.add_partial("generate_until", request.args, text)
            out.append(text)
        return out

    def _generation_prompt(self, context: str) -> list[int]:
        """The hf backend's `tok_batch_encode` for one context."""
        special: dict[str, bool] = {}
        if has_bos_prefix(context, getattr(self.tokenizer, "bos_token", None)):
            special = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            special = {"add_special_tokens": self.add_bos_token}
        return self.tokenizer(context, **special)["input_ids"]

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The tokenizer's chat template with the model_args' chat_template_kwargs."""
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
            **(self.config.chat_template_kwargs or {}),
        )

    def get_model_info(self) -> dict[str, Any]:
        return {
            "model": self.loaded.name,
            "architecture": self.loaded.architecture,
            "dtype": self.config.dtype,
            "device": self.config.device,
            "numerics": "fast" if self.config.fast_numerics else "invariant",
            "lora": dict(self.config.lora),
        }


def _close(core: EngineCore, loaded: Any) -> None:
    core.close()
    loaded.close()
