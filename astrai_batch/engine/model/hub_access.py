"""What the local machine knows about a hub id before any network call: whether the hub is
offline (HF_HUB_OFFLINE), whether the id is in the local hub cache, whether the hub can be
reached at all (one connection attempt, seconds at most), and which names lie close to a
mistyped one.

A hub id that is neither cached nor reachable would otherwise cost huggingface_hub's retries
(tens of seconds, a dozen lines) before failing; with these checks it fails at once, naming
what the user may have meant.
"""

from __future__ import annotations

import difflib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

_TRUE = {"1", "on", "yes", "true"}
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
# One connection attempt to the hub's host; an unreachable hub fails in this time at most.
PROBE_SECONDS = 3.0


def hub_offline() -> bool:
    """Whether hub calls are off (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, as the environment
    says now or as huggingface_hub read it when imported)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def cached_snapshot(repo_id: str, revision: str | None) -> str | None:
    """The local directory of this model's cached files (at `revision`), or None when the hub
    cache does not hold its config.json."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except ValueError:  # not a valid repo id
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def cached_hub_ids() -> list[str]:
    """The model ids in the local hub cache (its ``models--org--name`` folders)."""
    from huggingface_hub import constants

    try:
        names = os.listdir(constants.HF_HUB_CACHE)
    except OSError:
        return []
    return sorted(
        name[len("models--") :].replace("--", "/") for name in names if name.startswith("models--")
    )


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether a connection to the hub's host opens. Behind a proxy we cannot tell from here,
    so the hub is assumed reachable and huggingface_hub decides."""
    from huggingface_hub import constants

    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return True
    endpoint = urlparse(constants.ENDPOINT)
    if not endpoint.hostname:
        return True
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def close_matches(text: str, candidates: list[str], count: int = 3) -> list[str]:
    """Up to `count` of `candidates` that look like `text` (case-insensitive), best first."""
    lowered = {candidate.lower(): candidate for candidate in candidates}
    found = difflib.get_close_matches(text.lower(), list(lowered), n=count, cutoff=0.6)
    return [lowered[name] for name in found]


def local_model_names(directory: Path) -> list[str]:
    """Model directories (with a config.json) and .gguf files directly in `directory`, as
    paths a user would type relative to the working directory."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        if (entry.is_dir() and (entry / "config.json").is_file()) or (
            entry.is_file() and entry.name.lower().endswith(".gguf")
        ):
            found.append(str(entry) if directory != Path(".") else entry.name)
    return sorted(found)
