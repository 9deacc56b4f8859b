"""The directories the `datasets` library writes, read in place as inputs (Arrow IPC files,
see `arrow_input`), never converted first:

- what `Dataset.save_to_disk` writes: ``state.json`` (its ``_data_files`` list the shards in
  order: ``data-00000-of-00003.arrow`` ...) beside ``dataset_info.json``;
- what `DatasetDict.save_to_disk` writes: ``dataset_dict.json`` (``{"splits": [...]}``) and
  one such directory per split; the input names the split's directory;
- a dataset's cache directory (``~/.cache/huggingface/datasets/<builder>/<config>/<version>/
  <hash>/``): ``dataset_info.json`` (its ``splits``) beside ``{name}-{split}.arrow``, or
  ``{name}-{split}-00000-of-00004.arrow`` ... for a sharded split. With one split the
  directory is the input; with several the input names one split's file or files (a glob).
"""

from __future__ import annotations

import json
import re
from typing import Any

from astrai_batch.errors import InputError
from astrai_batch.io.filesystems import Location

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
DICT_FILE = "dataset_dict.json"


def datasets_files(directory: Location) -> list[Location] | None:
    """The Arrow files of the `datasets` directory `directory`, in row order; None when it is
    not one. A directory holding several splits raises `InputError` naming them."""
    names = directory.list_names()
    if STATE_FILE in names:
        return _saved_dataset_files(directory)
    if DICT_FILE in names:
        splits = _read_json(directory.child(DICT_FILE)).get("splits") or []
        example = directory.child(splits[0]).shown if splits else directory.shown
        raise InputError(
            f"{directory.shown} is a saved DatasetDict with the splits {', '.join(splits)}: "
            f"name one split's directory, e.g. {example}"
        )
    arrow_names = [name for name in names if name.endswith(".arrow")]
    if INFO_FILE in names and arrow_names:
        return _cache_split_files(directory, arrow_names)
    return None


def _saved_dataset_files(directory: Location) -> list[Location]:
    state = _read_json(directory.child(STATE_FILE))
    entries = state.get("_data_files")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{directory.child(STATE_FILE).shown} lists no data files")
    state_file, files = directory.child(STATE_FILE).shown, []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise InputError(f"{state_file}: a data file has no filename")
        file = directory.child(name)
        if not file.is_file(InputError):
            raise InputError(f"{state_file} names {name}, which is not in {directory.shown}")
        files.append(file)
    return files


def _cache_split_files(directory: Location, arrow_names: list[str]) -> list[Location]:
    splits = _read_json(directory.child(INFO_FILE)).get("splits") or {}
    found = {}
    for split in splits:
        pattern = re.compile(rf".+-{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.arrow")
        names = sorted(name for name in arrow_names if pattern.fullmatch(name))
        if names:
            found[split] = names
    if not found:
        raise InputError(
            f"{directory.shown} is a `datasets` cache directory but holds no Arrow file of "
            f"its splits ({', '.join(splits) or 'none listed in dataset_info.json'})"
        )
    if len(found) > 1:
        examples = [
            directory.child(names[0] if len(names) == 1 else _shard_glob(names[0])).shown
            for names in found.values()
        ]
        raise InputError(
            f"{directory.shown} holds the splits {', '.join(found)} of a `datasets` cache: "
            f"name one split's files, e.g. {' or '.join(examples)}"
        )
    return [directory.child(name) for name in next(iter(found.values()))]


def _shard_glob(name: str) -> str:
    """``x-train-00000-of-00004.arrow`` -> ``x-train-*.arrow``."""
    return re.sub(r"-\d{5}-of-\d{5}\.arrow$", "-*.arrow", name)


def _read_json(file: Location) -> dict[str, Any]:
    try:
        value = json.loads(file.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {file.shown}: {exc}") from exc
    if not isinstance(value, dict):
        raise InputError(f"{file.shown} is not a JSON object")
    return value
