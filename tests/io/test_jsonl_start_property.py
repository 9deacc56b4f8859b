"""`iter_rows(start, stop)` yields exactly rows `start .. stop-1` for any JSON Lines input.

Contents are drawn at random: plain or gzip, prompt / messages / token-id rows or OpenAI
Batch request lines, with blank lines (not rows), invalid JSON and non-object lines (row
errors), repeated and missing ids, CRLF endings, and enough rows to cross several recorded
row offsets. The reference is the full read (itself checked against a count of the
non-blank lines), so a row read twice, skipped, or given another row's line number fails.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astrai_batch.io import open_input
from astrai_batch.io.jsonl_input import OFFSET_STRIDE


def plain_line(kind: str, number: int) -> str:
    ident = {"id": f"r{number % 97}"}  # ids repeat: duplicate-id rows are row errors
    if kind == "prompt":
        return json.dumps({**ident, "prompt": f"p{number}"})
    if kind == "messages":
        return json.dumps({**ident, "messages": [{"role": "user", "content": f"m{number}"}]})
    if kind == "tokens":
        return json.dumps({"prompt_token_ids": [number, number + 1]})
    if kind == "openai":
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{number}"}]}
        return json.dumps(
            {"custom_id": f"c{number % 89}", "method": "POST", "url": "/v1/chat/completions"}
            | {"body": body}
        )
    if kind == "blank":
        return "   "
    if kind == "bad-json":
        return '{"prompt": '
    return "[1, 2]"  # not an object


FAMILIES = {
    "rows": ["prompt", "messages", "tokens", "blank", "bad-json", "list"],
    "openai": ["openai", "blank", "bad-json"],
}


@st.composite
def inputs(draw: st.DrawFn) -> tuple[list[str], bool, str]:
    family = draw(st.sampled_from(sorted(FAMILIES)))
    count = draw(st.integers(min_value=1, max_value=3 * OFFSET_STRIDE + 5))
    kinds = draw(
        st.lists(st.sampled_from(FAMILIES[family]), min_size=count, max_size=count).filter(
            lambda ks: any(k not in ("blank", "bad-json", "list") for k in ks)
        )
    )
    lines = [plain_line(kind, number) for number, kind in enumerate(kinds)]
    return lines, draw(st.booleans()), draw(st.sampled_from(["\n", "\r\n"]))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=inputs(), data=st.data())
def test_iter_rows_between_any_bounds_is_the_slice_of_the_full_read(
    drawn: tuple[list[str], bool, str], data: st.DataObject
) -> None:
    lines, compressed, ending = drawn
    text = "".join(line + ending for line in lines).encode()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ("in.jsonl.gz" if compressed else "in.jsonl")
        path.write_bytes(gzip.compress(text) if compressed else text)
        source = open_input(path)
        full = list(source.iter_rows())
        assert source.count_rows() == len(full) == sum(1 for line in lines if line.strip())
        assert [row.index for row in full] == list(range(len(full)))
        end = len(full) + 2
        for _ in range(4):
            start = data.draw(st.integers(min_value=0, max_value=end), label="start")
            stop = data.draw(st.one_of(st.none(), st.integers(min_value=start, max_value=end)))
            got = list(source.iter_rows(start, stop))
            assert got == full[start:stop], f"start={start} stop={stop}"
