"""A Parquet or Arrow cell's image read from where it is stored (`io.image_cells`): the rows
name their image cells (not their bytes), and reading one gives the stored bytes for every
row, list item and struct cell, whatever row group the row is in and wherever the read
started; each row group's column read once while rows come in its order; a changed or
vanished file an `ImageError` with a one-line reason."""

from __future__ import annotations

import io
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import ImageError
from astrai_batch.io import open_input
from astrai_batch.io.image_cells import CellReader
from astrai_batch.io.image_sources import ImageRef, load_image

Image = pytest.importorskip("PIL.Image")
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2 + seed % 3, 2), (seed * 40 % 256, seed, 255 - seed)).save(buffer, "PNG")
    return buffer.getvalue()


def stored_images(column: str, rows) -> list[bytes]:
    """The image bytes `table` stores in `column` for `rows`, in order."""
    if column == "one":
        return [png(i) for i in rows]
    if column == "hf":
        return [png(50 + i) for i in rows]
    return [image for i in rows for image in (png(100 + i), png(200 + i))]


def table(rows: int) -> pa.Table:
    return pa.table(
        {
            "prompt": [f"q{i}" for i in range(rows)],
            "one": pa.array([png(i) for i in range(rows)], pa.binary()),
            "many": pa.array([[png(100 + i), png(200 + i)] for i in range(rows)]),
            "hf": pa.array(
                [{"bytes": png(50 + i), "path": f"{i}.png"} for i in range(rows)], HF_IMAGE
            ),
        }
    )


@pytest.mark.parametrize("column", ["one", "many", "hf"])
def test_every_cell_reads_again_as_first_read_across_row_groups(tmp_path, column) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(table(7), path, row_group_size=3)  # row groups of 3, 3 and 1 rows
    for start in (0, 4):  # a read from the start, and one from inside the second row group
        rows = list(open_input(path, image_column=column).iter_rows(start=start))
        refs = [ref for row in rows for ref in row.images]
        want = stored_images(column, range(start, 7))
        assert [(ref.data, ref.cell.size) for ref in refs] == [(None, len(b)) for b in want]
        reader = CellReader(keep=1)
        for ref, data in zip(refs, want, strict=True):
            assert reader.read(ref.cell) == data
            assert load_image(ref, cells=reader).image.tobytes() == (
                load_image(ImageRef(data=data)).image.tobytes()
            )
        # in input order each row group's column is read once: (rows 4..6: groups 1 and 2)
        assert reader.reads == (3 if start == 0 else 2)
        assert reader.kept_groups == 1


def test_the_reader_keeps_the_last_row_groups_it_read(tmp_path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(table(6), path, row_group_size=2)
    refs = [row.images[0] for row in open_input(path, image_column="one").iter_rows()]
    order = [0, 1, 2, 3, 4, 0, 5, 1]  # rows of groups 0, 0, 1, 1, 2, 0, 2, 0
    for keep, reads in ((0, 8), (1, 6), (2, 4), (3, 3)):
        reader = CellReader(keep=keep)
        for position in order:
            assert reader.read(refs[position].cell) == png(position)
        assert (reader.reads, reader.kept_groups) == (reads, min(keep, 3))
    # pickled (for other processes) without what it keeps
    copy = pickle.loads(pickle.dumps(reader))
    assert (copy.keep, copy.reads, copy.kept_groups) == (3, 0, 0)
    assert copy.read(refs[5].cell) == png(5)


def test_an_arrow_file_reads_again_by_record_batch(tmp_path) -> None:
    path = tmp_path / "in.arrow"
    data = table(5)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, data.schema) as writer:
        for batch in data.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    rows = list(open_input(path, image_column="one").iter_rows(start=1))
    reader = CellReader()
    assert [row.images[0].cell.origin.row_group for row in rows] == [0, 1, 1, 2]
    assert [reader.read(row.images[0].cell) for row in rows] == [png(i) for i in range(1, 5)]


def test_a_changed_or_vanished_file_is_an_image_error(tmp_path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(table(4), path, row_group_size=2)
    refs = [row.images[0] for row in open_input(path, image_column="many").iter_rows()]
    listed = [row.images[1] for row in open_input(path, image_column="many").iter_rows()]
    name = path.name
    pq.write_table(table(3).slice(0, 3), path, row_group_size=2)  # row 3 gone
    reader = CellReader(keep=0)
    assert reader.read(refs[2].cell) == png(102)  # an unchanged row still reads
    with pytest.raises(ImageError) as gone_row:
        reader.read(refs[3].cell)
    assert str(gone_row.value) == (
        f"image at many[0] of row 1 in row group 1 of {name} changed after the job first read it"
    )
    shorter = table(4).set_column(2, "many", pa.array([[png(1)]] * 4))  # one item a list
    pq.write_table(shorter, path, row_group_size=2)
    with pytest.raises(ImageError, match=r"^image at many\[1\] of row 0 in row group 0 of"):
        reader.read(listed[0].cell)
    # other bytes in place read as they are: the image's key tells (`ImageInput.materialized`)
    assert reader.read(refs[0].cell) == png(1)
    path.unlink()
    with pytest.raises(ImageError) as vanished:
        reader.read(refs[0].cell)
    assert str(vanished.value).endswith(f"{name} is gone: its images cannot be read again")
