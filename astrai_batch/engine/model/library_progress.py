"""Third-party progress bars off while a model loads, unless stderr is a terminal.

transformers draws tqdm bars while it reads weights ("Loading weights"), writes shards and
dequantises a GGUF (a bare `tqdm.auto` bar, one frame per tensor, that ignores transformers'
own switch); huggingface_hub draws them while downloading. On a terminal they redraw in place;
in a log file or a pipe every frame stays, hundreds of carriage-return frames per load. So
where stderr is not a terminal they are switched off for the duration of a load, and only our
own progress lines are written. The previous settings come back afterwards, so a caller that
wants the bars elsewhere keeps them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# transformers modules that import tqdm directly instead of through its logging switch.
_BARE_TQDM_MODULES = ("transformers.modeling_gguf_pytorch_utils",)


def _silent_tqdm(*args: Any, **kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    kwargs["disable"] = True
    return tqdm(*args, **kwargs)


@contextmanager
def library_progress_off(stream: Any = None) -> Iterator[None]:
    """Within the block, no transformers / huggingface_hub / bare-tqdm bar is drawn, unless
    `stream` (default: sys.stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        yield
        return
    import importlib

    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as transformers_logging

    transformers_on = transformers_logging.is_progress_bar_enabled()
    hub_on = not hub_utils.are_progress_bars_disabled()
    patched: list[tuple[Any, Any]] = []
    transformers_logging.disable_progress_bar()  # also switches off huggingface_hub's bars
    try:
        for name in _BARE_TQDM_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:  # an optional dependency of that module is missing
                continue
            if hasattr(module, "tqdm"):
                patched.append((module, module.tqdm))
                module.tqdm = _silent_tqdm
        yield
    finally:
        for module, original in patched:
            module.tqdm = original
        if transformers_on:
            transformers_logging.enable_progress_bar()
        if hub_on:
            hub_utils.enable_progress_bars()
        elif not hub_utils.are_progress_bars_disabled():
            hub_utils.disable_progress_bars()
