"""``hf://datasets/ORG/NAME[@REVISION][/PATH]`` as an input: a dataset repository on the
Hugging Face hub, spelled as huggingface_hub, DuckDB and Polars spell it.

PATH may be a file, a directory or a glob (``data/train-*.parquet``); REVISION a branch, a
tag, a commit, ``refs/pr/N`` or ``~parquet`` (the hub's Parquet conversion of any dataset,
``refs/convert/parquet``, as DuckDB and Polars spell it). Online the files are read through
huggingface_hub's fsspec `HfFileSystem` (by ranges: a Parquet file's footer and the row
groups a read needs, nothing downloaded whole). With HF_HUB_OFFLINE set, or when the hub
cannot be reached, the files come from the local hub cache (HF_HUB_CACHE:
``datasets--ORG--NAME/snapshots/<commit>/``, the revision's commit read from ``refs/``),
where `hf download` or `datasets` left them; `HfFileSystem` itself has no offline mode.

A directory (the repository itself, by default) is read as the Parquet files of one split,
found as `datasets` finds them (a split keyword in a directory or file name: ``train``,
``validation`` / ``valid`` / ``dev`` / ``val``, ``test`` / ``eval``); a directory with
several splits is refused, naming a glob for each.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from urllib.parse import quote

import pyarrow.fs as pafs

from astrai_batch.errors import AstraiBatchError, InputError
from astrai_batch.io.filesystems import Location

SCHEME = "hf://"
SHAPE = "hf://datasets/ORG/NAME[@REVISION][/PATH]"
REVISION_ALIASES = {"~parquet": "refs/convert/parquet"}
_SPECIAL_REFS = re.compile(r"^refs/(convert/[\w-]+|pr/\d+)$")
_TRUE = {"1", "on", "yes", "true"}
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_WORD_SEPARATORS = re.compile(r"[-._ 0-9/]+")


def is_hub_uri(text: str) -> bool:
    return str(text).startswith(SCHEME)


def hub_offline() -> bool:
    """Whether hub calls are off (HF_HUB_OFFLINE, as the environment says now or as
    huggingface_hub read it when imported)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return bool(constants.HF_HUB_OFFLINE) or value in _TRUE


def hub_location(text: str, error: type[AstraiBatchError] = InputError) -> Location:
    """The `Location` of an ``hf://datasets/...`` URI: on the hub, or in the local cache."""
    from huggingface_hub.errors import HfUriError
    from huggingface_hub.utils import parse_hf_uri

    try:
        uri = parse_hf_uri(text)
    except HfUriError as exc:
        raise error(f"cannot read {text}: expected {SHAPE}") from exc
    if uri.type != "dataset":
        raise error(f"{text} names a {uri.type} repository; an input is a dataset: {SHAPE}")
    revision = REVISION_ALIASES.get(uri.revision or "", uri.revision)
    path = uri.path_in_repo.strip("/")
    if hub_offline():
        return _cached(text, uri.id, revision, path, "HF_HUB_OFFLINE is set", error)
    unreachable = _hub_problem(uri.id, revision, error)
    if unreachable is not None:
        return _cached(text, uri.id, revision, path, unreachable, error)
    from huggingface_hub import HfFileSystem

    root = f"datasets/{uri.id}" + (f"@{_quoted(revision)}" if revision else "")
    filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem()))
    return Location(filesystem, posixpath.join(root, path) if path else root, text)


def _quoted(revision: str) -> str:
    # HfFileSystem reads refs/pr/N and refs/convert/X as they are, other revisions quoted.
    return revision if _SPECIAL_REFS.match(revision) else quote(revision, safe="")


def _hub_problem(repo: str, revision: str | None, error: type[AstraiBatchError]) -> str | None:
    """None when the hub answers for this dataset; why it cannot be reached otherwise (the
    cache is tried then). A dataset or revision the hub does not have raises `error`."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        HfApi().dataset_info(repo, revision=revision, timeout=10)
    except GatedRepoError as exc:
        raise error(f"dataset {repo} is gated: accept its terms on the hub and log in") from exc
    except RevisionNotFoundError as exc:
        raise error(f"dataset {repo} has no revision {revision!r} on the hub") from exc
    except RepositoryNotFoundError as exc:
        raise error(
            f"dataset {repo} is not on the hub (or is private: log in with `hf auth login`)"
        ) from exc
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        return f"the hub answered {status or type(exc).__name__}"
    except Exception as exc:  # any failure to reach the hub: use the cache
        return f"the hub cannot be reached ({type(exc).__name__})"
    return None


def _cached(
    text: str,
    repo: str,
    revision: str | None,
    path: str,
    why: str,
    error: type[AstraiBatchError],
) -> Location:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo, repo_type="dataset", revision=revision, local_files_only=True
        )
    except (LocalEntryNotFoundError, OSError) as exc:
        at = f" at revision {revision}" if revision else ""
        flag = f" --revision {revision}" if revision else ""
        raise error(
            f"dataset {repo}{at} is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and {why}: download it where the hub is reachable "
            f"with `hf download {repo} --repo-type dataset{flag}` (or point HF_HUB_CACHE at a "
            "cache that holds it)"
        ) from exc
    local = posixpath.join(folder, path) if path else folder
    return Location(pafs.LocalFileSystem(), local, text)


def split_of(relative: str) -> str:
    """The split `datasets` gives a data file of a repository, by the keywords in its
    directory names first, then in its file name; "train" when there are none."""
    *directories, name = relative.split("/")
    for words in (directories, [posixpath.splitext(name)[0]]):
        tokens = {token for word in words for token in _WORD_SEPARATORS.split(word.lower())}
        for split, keywords in SPLIT_KEYWORDS.items():
            if tokens & set(keywords):
                return split
    return "train"


def split_files(directory: Location, files: Sequence[Location]) -> list[Location]:
    """`files` (the Parquet files under the repository directory `directory`, in path order)
    when they hold one split; several splits raise `InputError` naming a glob for each."""
    if not files:
        raise InputError(
            f"no .parquet files in {directory.shown}; name a file or a glob, or read the hub's "
            f"Parquet conversion: {directory.shown.split('@')[0].rstrip('/')}@~parquet"
        )
    prefix = directory.path.rstrip("/") + "/"
    by_split: dict[str, list[str]] = {}
    for file in files:
        by_split.setdefault(split_of(file.path[len(prefix) :]), []).append(file.path[len(prefix) :])
    if len(by_split) == 1:
        return list(files)
    order = [*SPLIT_KEYWORDS]
    by_split = dict(sorted(by_split.items(), key=lambda item: order.index(item[0])))
    examples = ", ".join(
        f"{split}: {directory.child(_example(paths, by_split)).shown}"
        for split, paths in by_split.items()
    )
    raise InputError(
        f"{directory.shown} holds the splits {', '.join(by_split)}: name one, as a file or a "
        f"glob ({examples})"
    )


def _example(paths: list[str], by_split: dict[str, list[str]]) -> str:
    """A glob for one split's `paths` that matches no other split's file (else its first)."""
    from astrai_batch.io.globs import compile_glob

    glob = split_glob(paths)
    matcher = compile_glob(glob)
    others = [path for group in by_split.values() if group is not paths for path in group]
    return paths[0] if any(matcher.fullmatch(path) for path in others) else glob


def split_glob(relative_paths: Sequence[str]) -> str:
    """A glob matching `relative_paths` (one split's files): their one file, their common
    directory and name prefix, or their common directory's Parquet files at any depth."""
    if len(relative_paths) == 1:
        return relative_paths[0]
    folders = {posixpath.dirname(path) for path in relative_paths}
    if len(folders) == 1:
        folder = folders.pop()
        names = [posixpath.basename(path) for path in relative_paths]
        prefix = os.path.commonprefix(names)  # noqa: RUF071 - a common name prefix is meant
        name = prefix.rstrip("0123456789") + "*.parquet"
        return posixpath.join(folder, name) if folder else name
    common = posixpath.commonpath(relative_paths)
    return posixpath.join(common, "**", "*.parquet") if common else "**/*.parquet"
