"""One warning per ignored OpenAI body field name per job (`io.openai_fields`)."""

from __future__ import annotations

from collections.abc import Iterable

from astrai_batch.io import InputRow
from astrai_batch.io.openai_fields import ignored_field_warning


class IgnoredFieldWarnings:
    """Collects the ignored field names rows carry; `new_warnings` gives each name's warning
    once, in name order (rows are seen in a worker thread, warnings written on the loop)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._pending: set[str] = set()

    def see(self, rows: Iterable[InputRow]) -> None:
        for row in rows:
            self.see_names(row.ignored_fields)

    def see_names(self, names: Iterable[str]) -> None:
        """Names gathered elsewhere (a Ray job's read tasks)."""
        for name in names:
            if name not in self._seen:
                self._seen.add(name)
                self._pending.add(name)

    def new_warnings(self) -> list[str]:
        names, self._pending = sorted(self._pending), set()
        return [ignored_field_warning(name) for name in names]
