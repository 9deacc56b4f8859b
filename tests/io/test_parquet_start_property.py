"""`iter_rows(start, stop)` yields exactly rows `start..stop-1` for any Parquet layout.

Layouts are drawn at random: a single file or a directory of files, each with row groups of
any sizes (uneven, a smaller last group, empty files), and every start from 0 past the end.
The reference is the full read, so a group wrongly skipped or a row read twice fails it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astrai_batch.io import open_input

SCHEMA = pa.schema([("id", pa.string()), ("prompt", pa.string())])


def write_groups(path: Path, group_rows: list[int], first: int) -> int:
    """One file whose row groups hold exactly `group_rows` rows; returns the next row number."""
    with pq.ParquetWriter(path, SCHEMA) as writer:
        for rows in group_rows:
            numbers = range(first, first + rows)
            writer.write_table(
                pa.table(
                    {"id": [f"r{i}" for i in numbers], "prompt": [f"p{i}" for i in numbers]},
                    schema=SCHEMA,
                ),
                row_group_size=max(rows, 1),
            )
            first += rows
    return first


def test_resume_inside_an_earlier_group_reads_every_later_group(tmp_path: Path) -> None:
    # Groups of 1000, 1000 and 500 rows: starting at 1600 must not count the smaller last
    # group as skipped (it was, and row 1600 came back with row 1100's id).
    path = tmp_path / "in.parquet"
    assert write_groups(path, [1000, 1000, 500], 0) == 2500
    assert [g.num_rows for g in map(pq.ParquetFile(path).metadata.row_group, range(3))] == [
        1000,
        1000,
        500,
    ]
    rows = list(open_input(path).iter_rows(1600))
    assert [row.index for row in rows] == list(range(1600, 2500))
    assert [row.id for row in rows] == [f"r{i}" for i in range(1600, 2500)]
    assert [row.prompt for row in rows] == [f"p{i}" for i in range(1600, 2500)]


layouts = st.lists(
    st.lists(st.integers(min_value=0, max_value=1500), min_size=0, max_size=4),
    min_size=1,
    max_size=3,
).filter(lambda files: sum(map(sum, files)) > 0)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(files=layouts, data=st.data())
def test_iter_rows_from_any_start_is_the_tail_of_the_full_read(
    files: list[list[int]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if len(files) == 1:
            target = root / "in.parquet"
            total = write_groups(target, files[0], 0)
        else:
            target, total = root / "dataset", 0
            target.mkdir()
            for number, groups in enumerate(files):
                total = write_groups(target / f"part-{number:02d}.parquet", groups, total)
        source = open_input(target)
        assert source.count_rows() == total
        full = list(source.iter_rows())
        assert [row.id for row in full] == [f"r{i}" for i in range(total)]
        assert [row.index for row in full] == list(range(total))
        starts = data.draw(
            st.lists(st.integers(min_value=0, max_value=total + 2), min_size=1, max_size=6)
        )
        for start in starts:
            assert list(source.iter_rows(start)) == full[start:], f"start={start}"
            stop = data.draw(st.integers(min_value=start, max_value=total + 2), label="stop")
            assert list(source.iter_rows(start, stop)) == full[start:stop], f"{start}:{stop}"
