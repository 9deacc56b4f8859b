"""The vision encoder's outputs by image content: a repeated image is encoded once.

Bounded by bytes (least recently used first out). An image whose prefill a step covered only
in part is pinned until a later step covers its last placeholder (chunked prefill): its
features stay whatever the budget, so a request never encodes its image twice. A request
that ends mid-image (cancelled, failed) leaves its pin until the same image finishes or the
runner is dropped; a pinned entry's bytes count against the budget like any other.

Invariants (`check_invariants`): `bytes_held` is the sum of the held tensors' sizes; every
pinned key is held; past the budget, only pinned entries are held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from astrai_batch.engine.vision.image_inputs import ImageInput

DEFAULT_ENCODER_CACHE_BYTES = 256 * 2**20


@dataclass
class EncoderCounts:
    encoded: int = 0  # images run through the vision tower
    reused: int = 0  # feature lookups served from the cache (encoder calls saved)


class EncoderCache:
    def __init__(
        self,
        encode: Callable[[ImageInput], torch.Tensor],
        max_bytes: int = DEFAULT_ENCODER_CACHE_BYTES,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._encode = encode
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._pinned: set[bytes] = set()
        self.bytes_held = 0
        self.counts = EncoderCounts()

    def features(self, image: ImageInput, *, finishes: bool) -> torch.Tensor:
        """The image's features [length, hidden]. `finishes`: this step covers its last
        placeholder (else it stays pinned for the steps that follow)."""
        key = image.key
        held = self._entries.get(key)
        if held is None:
            held = self._encode(image)
            self.counts.encoded += 1
            self._entries[key] = held
            self.bytes_held += _size(held)
        else:
            self.counts.reused += 1
            self._entries.move_to_end(key)
        if finishes:
            self._pinned.discard(key)
        else:
            self._pinned.add(key)
        self._trim()
        return held

    def _trim(self) -> None:
        if self.bytes_held <= self.max_bytes:
            return
        for key in list(self._entries):
            if self.bytes_held <= self.max_bytes:
                break
            if key in self._pinned:
                continue
            self.bytes_held -= _size(self._entries.pop(key))

    def __len__(self) -> int:
        return len(self._entries)

    def check_invariants(self) -> None:
        total = sum(_size(t) for t in self._entries.values())
        if total != self.bytes_held:
            raise RuntimeError(f"encoder cache holds {total} bytes, counted {self.bytes_held}")
        if not self._pinned <= set(self._entries):
            raise RuntimeError("a pinned image's features are not held")
        loose = [k for k in self._entries if k not in self._pinned]
        if self.bytes_held > self.max_bytes and loose:
            raise RuntimeError("unpinned encoder features are held past the cache's budget")


def _size(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
