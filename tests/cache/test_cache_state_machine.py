"""Random interleavings of the scheduler's calls against `KVCacheManager`.

Besides the manager's own invariants, the machine keeps a shadow of what each page slot
holds (the token prefix whose K/V was written there) and checks that every request's pages
hold exactly its own prefix: a cache hit or a switch to a canonical page must never hand a
request someone else's K/V, and a request must only ever write into pages it holds alone.
"""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from astrai_batch.cache import KVCacheManager

# Prompts share these starts at varying lengths, so hits, partial-page misses and identical
# pages computed by two requests all happen. Tokens come from a tiny alphabet for the same reason.
BASE_PREFIXES = ((1, 2, 3, 1, 2, 3, 4, 4), (1, 2, 3, 2, 2), (3, 3, 3, 3, 1, 1))
TOKENS = st.integers(min_value=1, max_value=3)
MAX_OPEN = 4  # enough to share pages and exhaust small pools, few enough that requests finish


class _Request:
    def __init__(self, tokens: list[int], computed: int) -> None:
        self.tokens = tokens
        self.computed = computed  # leading tokens whose K/V is written


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[Hashable, _Request] = {}
        self.finished: list[tuple[int, ...]] = []
        self.next_id = 0

    @initialize(
        page_size=st.integers(min_value=2, max_value=4),
        num_pages=st.integers(min_value=4, max_value=14),
        enable=st.sampled_from([True, True, True, False]),
        warm_up=st.lists(st.sampled_from(BASE_PREFIXES), min_size=1, max_size=3),
    )
    def build(
        self, page_size: int, num_pages: int, enable: bool, warm_up: list[tuple[int, ...]]
    ) -> None:
        self.page_size = page_size
        self.manager = KVCacheManager(num_pages, page_size, enable_prefix_cache=enable)
        # shadow[page][offset]: the token prefix whose last token's K/V sits in that slot.
        self.shadow: list[list[tuple[int, ...] | None]] = [
            [None] * page_size for _ in range(num_pages)
        ]
        # Finished requests leave pages behind, so most runs start with something to hit.
        for tokens in warm_up:
            request_id = self.new_request(list(tokens), max_cached=len(tokens) - 1)
            self.write(request_id, len(tokens), list(tokens))
            self.finish(request_id, publish=True)

    def new_request(self, tokens: list[int], max_cached: int) -> int:
        request_id = self.next_id
        self.next_id += 1
        hit = self.manager.open(request_id, tokens, max_cached)
        assert hit % self.page_size == 0
        assert hit <= max_cached
        assert len(self.manager.pages(request_id)) == hit // self.page_size
        self.requests[request_id] = _Request(tokens, hit)
        return request_id

    def write(self, request_id: int, target: int, tokens: list[int]) -> bool:
        """Reserve pages up to `target` and write the K/V of the new positions, like a step."""
        request = self.requests[request_id]
        before = self.snapshot()
        held = len(self.manager.pages(request_id))
        available = self.manager.available_pages()
        if not self.manager.reserve(request_id, target):
            assert -(-target // self.page_size) - held > available
            assert self.snapshot() == before
            return False
        pages = self.manager.pages(request_id)
        assert len(pages) == max(held, -(-target // self.page_size))
        for position in range(request.computed, target):
            page = pages[position // self.page_size]
            assert self.manager.allocator.refcount(page) == 1, "wrote into a shared page"
            self.shadow[page][position % self.page_size] = tuple(tokens[: position + 1])
        request.tokens = tokens
        request.computed = target
        return True

    def finish(self, request_id: int, *, publish: bool) -> None:
        request = self.requests.pop(request_id)
        tokens = request.tokens[: request.computed] if publish else None
        self.manager.close(request_id, tokens)
        assert request_id not in self.manager
        if request.computed:
            self.finished.append(tuple(request.tokens[: request.computed]))

    def pick(self, data: st.DataObject) -> Hashable:
        return data.draw(st.sampled_from(sorted(self.requests)), label="request")

    def snapshot(self) -> tuple[object, ...]:
        manager = self.manager
        return (
            manager.stats(),
            [manager.allocator.refcount(page) for page in range(manager.num_pages)],
            {rid: manager.pages(rid) for rid in self.requests},
            None if manager.index is None else manager.index.pin_counts(),
        )

    @precondition(lambda self: len(self.requests) < MAX_OPEN)
    @rule(
        data=st.data(),
        suffix=st.lists(TOKENS, max_size=5),
        keep=st.integers(min_value=0, max_value=3),
    )
    def open_request(self, data: st.DataObject, suffix: list[int], keep: int) -> None:
        # A prompt starts like a base prefix, a running request, or a finished one (a chat that
        # continues), so that hits and identical pages computed twice are common.
        running = tuple(tuple(request.tokens) for request in self.requests.values())
        starts = BASE_PREFIXES + running + tuple(self.finished)
        base = data.draw(st.sampled_from(starts), label="start")
        drop = data.draw(st.integers(min_value=0, max_value=len(base)), label="drop")
        tokens = [*base[: len(base) - drop], *suffix] or [1]
        self.new_request(tokens, max_cached=max(0, len(tokens) - keep))

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), chunk=st.integers(min_value=0, max_value=6))
    def compute(self, data: st.DataObject, chunk: int) -> None:
        """Reserve and write K/V: a prefill chunk (0 = the rest of the prompt) or decode steps."""
        request_id = self.pick(data)
        request = self.requests[request_id]
        prompt_left = len(request.tokens) - request.computed
        if prompt_left > 0:
            target = request.computed + (min(chunk, prompt_left) if chunk else prompt_left)
            tokens = request.tokens
        else:
            target = request.computed + max(1, chunk)
            generated = data.draw(
                st.lists(TOKENS, min_size=target - len(request.tokens), max_size=6),
                label="generated",
            )
            tokens = request.tokens + generated
        self.write(request_id, target, tokens)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        request_id = self.pick(data)
        request = self.requests[request_id]
        self.manager.publish(request_id, request.tokens[: request.computed])

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), with_tokens=st.booleans())
    def close(self, data: st.DataObject, with_tokens: bool) -> None:
        self.finish(self.pick(data), publish=with_tokens)

    @rule(count=st.integers(min_value=0, max_value=4))
    def evict(self, count: int) -> None:
        evictable = self.manager.num_evictable_pages()
        free = self.manager.num_free_pages()
        freed = self.manager.evict(count)
        assert len(freed) == min(count, evictable)
        assert self.manager.num_free_pages() == free + len(freed)
        assert all(self.manager.allocator.refcount(page) == 0 for page in freed)

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        if hasattr(self, "manager"):
            self.manager.check_invariants()

    @invariant()
    def every_request_sees_its_own_prefix(self) -> None:
        for request_id, request in self.requests.items():
            pages = self.manager.pages(request_id)
            for position in range(request.computed):
                slot = self.shadow[pages[position // self.page_size]][position % self.page_size]
                assert slot == tuple(request.tokens[: position + 1]), (request_id, position)

    def teardown(self) -> None:
        if not hasattr(self, "manager"):
            return
        manager = self.manager
        for request_id, request in list(self.requests.items()):
            manager.close(request_id, request.tokens[: request.computed])
        manager.check_invariants()
        stats = manager.stats()
        assert stats.pages_in_use == 0
        assert manager.num_free_pages() + stats.cached_pages == manager.num_pages
        assert manager.num_evictable_pages() == stats.cached_pages
        # Nothing leaked: evicting everything returns the whole pool to the free list.
        assert len(manager.evict(manager.num_pages)) == stats.cached_pages
        assert manager.num_free_pages() == manager.num_pages
        manager.check_invariants()


CacheMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheMachine = CacheMachine.TestCase
