"""A chat row's images prepared for a vision-language model: the same token ids and pixels
as transformers' processor `apply_chat_template(..., tokenize=True)`, content ids at the
placeholders, and a bad image (undecodable, missing, too many) the row's one-line error."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from vision_kit import TOKENS_PER_IMAGE, image_message, random_image, save_tiny_llava

from astrai_batch.engine.vision.image_inputs import pixel_key, placeholder_ids
from astrai_batch.engine.vision.loading import load_vision_model
from astrai_batch.errors import ImageError
from astrai_batch.io.image_sources import ImageLimits, ImageRef
from astrai_batch.jobs.planning.image_encoding import encode_image_row


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    model_dir = save_tiny_llava(tmp_path_factory.mktemp("llava"))
    _, tower = load_vision_model(str(model_dir), {}, {"dtype": torch.float32})
    return tower


def data_url(image, fmt="PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def test_prompt_and_pixels_equal_the_processors_own(tower, tmp_path):
    photo, other = random_image(3), random_image(4, (20, 60))
    path = tmp_path / "other.png"
    other.save(path)
    messages = image_message("Compare them.", images=2)
    text = tower.processor.apply_chat_template(messages, add_generation_prompt=True)
    refs = [ImageRef(url=data_url(photo)), ImageRef(url=str(path))]
    encoded = encode_image_row(tower, "tiny", text, refs, ImageLimits())
    assert not isinstance(encoded, str), encoded
    ids, images = encoded
    # transformers' own path: the template tokenized by the processor, images beside it
    messages_with_images = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": photo},
                {"type": "image", "image": other},
                {"type": "text", "text": "Compare them."},
            ],
        }
    ]
    reference = tower.processor.apply_chat_template(
        messages_with_images,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    want = reference["input_ids"][0].tolist()
    assert [tower.image_token_id if t < 0 else t for t in ids] == want
    assert [image.length for image in images] == [TOKENS_PER_IMAGE] * 2
    for i, image in enumerate(images):
        assert image.pixel_values is None  # a row waiting in its window holds no pixels
        image = image.materialized()
        assert torch.equal(image.pixel_values, reference["pixel_values"][i : i + 1])
        assert image.key == pixel_key(reference["pixel_values"][i : i + 1])
        assert list(ids[image.offset : image.end]) == placeholder_ids(image.key, image.length)


def test_an_image_changed_or_gone_before_its_request_runs(tower, tmp_path):
    path = tmp_path / "photo.png"
    random_image(5).save(path)
    text = tower.processor.apply_chat_template(image_message("Hi?"), add_generation_prompt=True)
    _, (image,) = encode_image_row(tower, "tiny", text, [ImageRef(url=str(path))], ImageLimits())
    random_image(6).save(path)
    with pytest.raises(ValueError, match="the image changed after the job first read it"):
        image.materialized()
    path.unlink()
    with pytest.raises(ImageError, match=r"photo\.png"):
        image.materialized()


def test_bad_images_are_the_rows_errors(tower, tmp_path):
    text = tower.processor.apply_chat_template(image_message("Hi?"), add_generation_prompt=True)
    broken = "data:image/png;base64," + base64.b64encode(b"not a png at all").decode()
    got = encode_image_row(tower, "tiny", text, [ImageRef(url=broken)], ImageLimits())
    assert isinstance(got, str) and "\n" not in got and got.startswith("image ")
    missing = encode_image_row(
        tower, "tiny", text, [ImageRef(url=str(tmp_path / "gone.png"))], ImageLimits()
    )
    assert isinstance(missing, str) and "gone.png" in missing
    two = [ImageRef(url=data_url(random_image(1)))] * 2
    too_many = encode_image_row(tower, "tiny", text, two, ImageLimits(max_images_per_row=1))
    assert too_many == "the row has 2 images, more than --max-images-per-row 1"
    # one image part in the chat for two images: the placeholders do not fit
    mismatch = encode_image_row(tower, "tiny", text, two, ImageLimits())
    assert isinstance(mismatch, str) and "\n" not in mismatch


def test_the_planner_groups_rows_by_the_text_before_and_the_image(tower, tmp_path):
    """Rows over two images, interleaved in the input: the window runs each image's rows
    together (prefix order over content ids); every image row keeps its images."""
    from astrai_batch.engine.sampling.params import SamplingParams
    from astrai_batch.io import InputRow
    from astrai_batch.jobs.planning.tokenize import PromptEncoder
    from astrai_batch.jobs.planning.window import prepare_window

    urls = [data_url(random_image(31)), data_url(random_image(32))]

    def row(index, image, question):
        content = [{"type": "text", "text": question}]
        if image is None:
            return InputRow(
                index=index, id=f"r{index}", messages=({"role": "user", "content": question},)
            )
        content.insert(0, {"type": "image"})
        return InputRow(
            index=index,
            id=f"r{index}",
            messages=({"role": "user", "content": content},),
            images=(ImageRef(url=urls[image]),),
        )

    rows = [
        row(0, 0, "What is it?"),
        row(1, 1, "What is it?"),
        row(2, None, "Plain text."),
        row(3, 0, "Which colours?"),
        row(4, 1, "Which colours?"),
        row(5, 0, "How many things?"),
    ]
    encoder = PromptEncoder(tower.processor.tokenizer, "tiny", vision=tower)
    window = prepare_window(
        0, 0, rows, encoder=encoder, base_params=SamplingParams(), page_size=4,
        group_offset=0, grouping=True,
    )  # fmt: skip
    window.check_invariants()
    assert all(r.error is None for r in window.rows)
    order = [window.rows[p].id for p in window.order]
    by_image = {"r0": 0, "r3": 0, "r5": 0, "r1": 1, "r4": 1}
    image_runs = [by_image.get(rid) for rid in order]
    # each image's rows are consecutive in the execution order
    for image in (0, 1):
        at = [i for i, value in enumerate(image_runs) if value == image]
        assert at == list(range(at[0], at[0] + len(at)))
    # the rows of one image carry the same content ids at the same positions
    first = window.rows[0]
    for i in (3, 5):
        other = window.rows[i]
        assert other.images[0].key == first.images[0].key
        end = first.images[0].end
        assert other.token_ids[:end] == first.token_ids[:end]
    assert window.rows[1].token_ids[:end] != first.token_ids[:end]
    assert [len(window.rows[i].images) for i in range(6)] == [1, 1, 0, 1, 1, 1]


def bytes_reached(roots, shared) -> list[int]:
    """The lengths of the `bytes` objects, and of the strings over 256 characters (data
    URLs), reachable from `roots` (by `gc.get_referents`), not through `shared` (the job's
    objects every row points at: processor, reader, limits) nor functions, classes and
    modules (their globals)."""
    import gc
    import types

    skipped = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen, stack, found = {id(obj) for obj in shared}, list(roots), []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skipped):
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes) or (isinstance(obj, str) and len(obj) > 256):
            found.append(len(obj))
        else:
            stack.extend(gc.get_referents(obj))
    return found


def parquet_image_rows(path, images, rows: int):
    """A Parquet file of `rows` prompt rows, row i with the binary image i % len(images), in
    row groups of 2 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cells = [png_bytes(images[i % len(images)]) for i in range(rows)]
    prompts = [f"What is in picture {i}?" for i in range(rows)]
    pq.write_table(pa.table({"prompt": prompts, "img": cells}), path, row_group_size=2)


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def prepared(tower, path, encoder=None):
    from astrai_batch.engine.sampling.params import SamplingParams
    from astrai_batch.io import open_input
    from astrai_batch.jobs.planning.tokenize import PromptEncoder
    from astrai_batch.jobs.planning.window import prepare_window

    rows = list(open_input(path, image_column="img").iter_rows())
    encoder = encoder or PromptEncoder(tower.processor.tokenizer, "tiny", vision=tower)
    window = prepare_window(
        0, 0, rows, encoder=encoder, base_params=SamplingParams(), page_size=4,
        group_offset=0, grouping=True,
    )  # fmt: skip
    return window, encoder, rows


@pytest.mark.parametrize("rows", [3, 12])
def test_rows_waiting_in_a_window_hold_no_parquet_image_bytes(tower, tmp_path, rows):
    """A prepared window of Parquet image cells keeps, per image, its 32-byte key and where
    its bytes are stored: no image's bytes, however many rows wait (before, each image row
    held its cell's bytes from the reader until its window was done)."""
    images = [random_image(41), random_image(42, (64, 48))]
    parquet_image_rows(tmp_path / "in.parquet", images, rows)
    window, encoder, input_rows = prepared(tower, tmp_path / "in.parquet")
    assert all(row.images[0].cell is not None for row in input_rows)  # named, not read
    waiting = [image for row in window.rows for image in row.images]
    assert len(waiting) == rows
    shared = (encoder, tower.processor, encoder.image_cells, encoder.image_limits)
    assert sorted(bytes_reached([window], shared)) == [32] * rows  # the images' keys


def test_a_parquet_image_read_again_gives_the_first_reads_pixels(tower, tmp_path):
    """The engine's load reads each cell again and gets the pixels keyed at the first read;
    a cell whose image changed since fails its row with the changed-image reason, as a
    changed file does."""
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    images = [random_image(43), random_image(44)]
    parquet_image_rows(path, images, 5)
    window, encoder, _ = prepared(tower, path)
    by_index = {row.index: row.images[0] for row in window.rows}
    processor = tower.processor
    for index in range(5):
        loaded = by_index[index].materialized()
        want = processor.image_processor(images=[images[index % 2]], return_tensors="pt")
        assert torch.equal(loaded.pixel_values, want["pixel_values"])
        assert loaded.key == pixel_key(want["pixel_values"])
    # row groups {0, 1}, {2, 3}, {4}: read as the window was prepared, and again (the
    # reader keeps the last 2) as the rows entered the engine in input order
    assert encoder.image_cells.reads == 3 + 3
    table = pq.read_table(path)
    swapped = table.set_column(1, "img", table.column("img").take([1, 0, 2, 3, 4]))
    pq.write_table(swapped, path, row_group_size=2)
    fresh, _, _ = prepared(tower, path, encoder)
    assert fresh.rows[0].images[0].materialized().key == by_index[1].key
    with pytest.raises(ValueError, match=r"^the image changed after the job first read it$"):
        by_index[0].materialized()
    path.unlink()  # row 2's row group is no longer kept by the reader: read, and gone
    with pytest.raises(ImageError, match=r"in\.parquet is gone: its images cannot be read again"):
        by_index[2].materialized()


def test_waiting_rows_share_one_int_object_per_token_id(tower, tmp_path):
    """Every vocabulary id of a window's prompts is one int object, whatever the number of
    rows; an image's placeholders hold 8 (its content ids cycled), not one per token."""
    parquet_image_rows(tmp_path / "in.parquet", [random_image(45), random_image(46)], 6)
    window, _, _ = prepared(tower, tmp_path / "in.parquet")
    tokens = [t for row in window.rows for t in row.token_ids if t >= 0]
    assert max(tokens) > 256  # past the ints CPython shares by itself
    assert len({id(t) for t in tokens}) == len(set(tokens))
    for row in window.rows:
        (image,) = row.images
        content = row.token_ids[image.offset : image.end]
        assert len({id(t) for t in content}) == 8 < image.length == TOKENS_PER_IMAGE


@pytest.mark.parametrize("gzip", [False, True])
def test_a_finished_rows_images_are_released_from_its_window(tower, tmp_path, gzip):
    """A plain JSONL file's large data URLs wait as their place in the file (a span of a few
    dozen bytes, `io.data_url_spans`); a gzip file's stay in their rows (a gzip stream is not
    read again from the middle), but only until the row finishes: `release` drops a row's
    images, the job calls it for each finished row."""
    import gzip as gzip_module

    from astrai_batch.engine.sampling.params import SamplingParams
    from astrai_batch.io import open_input
    from astrai_batch.jobs.planning.tokenize import PromptEncoder
    from astrai_batch.jobs.planning.window import prepare_window

    urls = [data_url(random_image(47 + i, (40 + 8 * i, 40))) for i in range(3)]
    lines = [{"id": f"r{i}", "prompt": f"What is {i}?", "img": urls[i]} for i in range(3)]
    text = "".join(json.dumps(line) + "\n" for line in lines).encode()
    path = tmp_path / ("in.jsonl.gz" if gzip else "in.jsonl")
    path.write_bytes(gzip_module.compress(text) if gzip else text)
    rows = list(open_input(path, image_column="img").iter_rows())
    encoder = PromptEncoder(tower.processor.tokenizer, "tiny", vision=tower)
    window = prepare_window(
        0, 0, rows, encoder=encoder, base_params=SamplingParams(), page_size=4,
        group_offset=0, grouping=True,
    )  # fmt: skip
    del rows
    shared = (encoder, tower.processor, encoder.image_cells, encoder.image_limits)
    kept = [len(url) for url in urls] if gzip else []
    held = sorted(bytes_reached([window], shared))
    assert held == [32] * 3 + sorted(kept)  # keys, and (gzip) the data URLs
    window.release(1)
    assert [len(row.images) for row in window.rows] == [1, 0, 1]
    held = sorted(bytes_reached([window], shared))
    assert held == [32] * 2 + sorted(kept[i] for i in (0, 2) if gzip)
