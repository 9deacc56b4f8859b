"""An image in a prompt, as the engine takes it: the processor's pixel tensor, where its
placeholder tokens sit, and a key naming its content.

The placeholder positions of an image do not carry the processor's image token id in the
engine's prompt: they carry *content ids*, negative numbers drawn from the sha256 of the
pixel tensor (`placeholder_ids`). A negative id is never a vocabulary token, so everything
keyed by token ids (the prefix index's pages, the scheduler's page hashes, the planner's
prefix order and statistics) tells two images apart by their pixels and sees one image in
two rows as the same tokens: rows with the same text before the same image share its pages,
with no structure besides the prefix index mapping tokens to pages. The runner puts the
image's features at those positions (`tower`), and the sampler sees the real image token id
(`real_prompt`), as transformers does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# 30 bits of the digest per content id: 8 distinct ids per image, cycled over its tokens, so
# a full page of an image's placeholders holds 240 bits of its hash (and the prefix tree's
# path holds the rest of the image above it).
_ID_BITS = 30
_WORDS = 8


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image of a prompt: `pixel_values` (the processor's tensor for this image alone),
    its placeholders at `[offset, offset + length)`, `extras` the processor's other tensors
    for it that a model family needs (Qwen-VL: its `image_grid_thw`; held always, they are
    small), `key` the sha256 of them all (`pixel_key`).

    `runs`: where an image's placeholders are several runs with text between them
    (Idefics3's crops, each after its own `<row_r_col_c>` tokens), each run's `(offset,
    length)` in order, the lengths summing to `length` (the image's features in order);
    empty for one run. One image stays one input (one key, one encoder call, one load):
    transformers encodes an image's crops in one batch, the call whose bits the engine keeps.

    A job keeps only the key and `load` (which makes the tensor again: decode and process)
    while a row waits in its window; the engine loads the pixels when the request arrives
    (`materialized`), so only the requests in the engine hold pixels, whatever the window."""

    key: bytes
    offset: int
    length: int
    pixel_values: torch.Tensor | None = None
    load: Callable[[], torch.Tensor] | None = None
    extras: tuple[torch.Tensor, ...] = ()
    runs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if len(self.key) != 32:
            raise ValueError("ImageInput.key must be a 32-byte sha256 digest")
        if (self.pixel_values is None) == (self.load is None):
            raise ValueError("an ImageInput has exactly one of pixel_values and load")
        if self.offset < 0 or self.length <= 0:
            raise ValueError(
                f"ImageInput needs offset >= 0 and length > 0, got {self.offset}, {self.length}"
            )
        if self.runs:
            starts_ok = self.runs[0][0] == self.offset and all(
                a + n < b for (a, n), (b, _) in zip(self.runs, self.runs[1:], strict=False)
            )
            if not starts_ok or any(n <= 0 for _, n in self.runs):
                raise ValueError("ImageInput.runs must be ordered, apart, from its offset")
            if sum(n for _, n in self.runs) != self.length:
                raise ValueError("ImageInput.runs must hold its length placeholders")

    @property
    def end(self) -> int:
        """One past its last placeholder (text between its runs lies inside)."""
        last, count = self.spans[-1]
        return last + count

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """Its placeholder runs, `(offset, length)` each (one for most families)."""
        return self.runs or ((self.offset, self.length),)

    def placeholders_before(self, position: int) -> int:
        """How many of its placeholders lie before prompt `position`."""
        return sum(max(0, min(position, at + n) - at) for at, n in self.spans)

    def materialized(self) -> ImageInput:
        """This image with its pixels in memory (loaded now when it has only `load`). Raises
        what `load` raises, or ValueError when the pixels are not the ones keyed."""
        if self.pixel_values is not None:
            return self
        assert self.load is not None
        pixels = self.load()
        if pixel_key(pixels, self.extras) != self.key:
            raise ValueError("the image changed after the job first read it")
        return ImageInput(
            self.key, self.offset, self.length, pixels, extras=self.extras, runs=self.runs
        )


def pixel_key(pixel_values: torch.Tensor, extras: Sequence[torch.Tensor] = ()) -> bytes:
    """sha256 of a pixel tensor's dtype, shape and values, then of each extra tensor's: equal
    for equal processor outputs (without extras, the pixels' digest alone)."""
    digest = hashlib.sha256()
    for tensor in (pixel_values, *extras):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.digest()


def placeholder_ids(key: bytes, length: int) -> list[int]:
    """The content ids of an image's `length` placeholder positions (all negative)."""
    ids = [
        -1 - (int.from_bytes(key[4 * i : 4 * i + 4], "little") >> (32 - _ID_BITS))
        for i in range(_WORDS)
    ]
    # the same 8 int objects cycled: a prompt waiting in its window keeps 8 per image, not
    # one per placeholder (576 for LLaVA-1.5)
    return [ids[j % _WORDS] for j in range(length)]


def image_prompt(
    token_ids: Sequence[int],
    image_token_id: int,
    pixel_values: Sequence[torch.Tensor],
    lengths: Sequence[int],
    loaders: Sequence[Callable[[], torch.Tensor]] | None = None,
    extras: Sequence[tuple[torch.Tensor, ...]] | None = None,
    split: bool = False,
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The engine's prompt for a processor's output: its image token positions, in order,
    `lengths[i]` consecutive ones per image `pixel_values[i]` (that image's tensor alone),
    replaced by content ids. `extras[i]`: the image's other processed tensors (none by
    default). With `loaders`, the images keep `loaders[i]` (which make `pixel_values[i]`
    again) instead of the tensors. `split`: an image's placeholders may be several runs
    (`ImageInput.runs`; `VisionTower.split_placeholders`), else they must be one. Raises
    ValueError when they do not pair up."""
    ids = [int(t) for t in token_ids]
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(positions) != sum(lengths) or len(lengths) != len(pixel_values):
        raise ValueError(
            f"the prompt has {len(positions)} image tokens where {len(pixel_values)} images "
            f"take {sum(lengths)}"
        )
    if extras is None:
        extras = [()] * len(pixel_values)
    images = []
    taken = 0
    for pixels, length, more in zip(pixel_values, lengths, extras, strict=True):
        mine = positions[taken : taken + length]
        taken += length
        runs = _runs(mine)
        if len(runs) > 1 and not split:
            raise ValueError("an image's placeholder tokens are not consecutive")
        key = pixel_key(pixels, more)
        for position, content_id in zip(mine, placeholder_ids(key, length), strict=True):
            ids[position] = content_id
        start = mine[0]
        runs = tuple(runs) if len(runs) > 1 else ()
        if loaders is None:
            images.append(ImageInput(key, start, length, pixels, extras=tuple(more), runs=runs))
        else:
            load = loaders[len(images)]
            images.append(ImageInput(key, start, length, load=load, extras=tuple(more), runs=runs))
    return ids, tuple(images)


def _runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Increasing positions as runs of consecutive ones, `(first, count)` each."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((position, 1))
    return runs


def real_prompt(prompt: Sequence[int], image_token_id: int) -> tuple[int, ...]:
    """The prompt as transformers sees it: content ids back to the image token id."""
    return tuple(image_token_id if t < 0 else t for t in prompt)


def check_image_prompt(prompt: Sequence[int], images: Sequence[ImageInput]) -> str | None:
    """Why a request's images do not match its prompt (a row error), or None when they do."""
    previous_end = 0
    for image in images:
        if image.offset < previous_end or image.end > len(prompt):
            return "the request's images overlap or lie past its prompt"
        content = placeholder_ids(image.key, image.length)
        done = 0
        for at, count in image.spans:
            if list(prompt[at : at + count]) != content[done : done + count]:
                return "an image's placeholder tokens do not carry its content ids"
            done += count
        previous_end = image.end
    covered = sum(image.length for image in images)
    if sum(1 for t in prompt if t < 0) != covered:
        return "the prompt has content ids outside its images"
    return None
