"""Micro-benchmarks of the cache layer's hot paths.

Run: .venv/bin/python scripts/bench_cache.py

Prints allocate+free pairs per second, and `PrefixIndex.match` / publish (`extend` of an
empty match, then `unpin`) median microseconds
for a 4,096-token prompt (page size 16) against an index holding 100,000 prompts that share 64
system prompts. Targets: >= 500,000 pairs/s and match <= 100 us.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from array import array

from astrai_batch.cache import PageAllocator, PrefixIndex

PAGE_SIZE = 16
SYSTEM_PROMPT_TOKENS = 256
PROMPT_TOKENS = 4_096
ALLOC_FREE_TARGET = 500_000
MATCH_TARGET_US = 100.0


def bench_allocate_free(pairs: int, runs: int) -> float:
    """Median single-page allocate + decref pairs per second."""
    allocator = PageAllocator(1_024)
    allocate, decref = allocator.allocate, allocator.decref
    rates = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(pairs):
            decref(allocate(1))
        rates.append(pairs / ((time.perf_counter_ns() - start) / 1e9))
    allocator.check_invariants()
    return statistics.median(rates)


class IndexBench:
    """An index of `num_prompts` prompts (a shared system prompt + a unique suffix each)."""

    def __init__(self, num_prompts: int, num_system: int, suffix_tokens: int, seed: int) -> None:
        self.rng = random.Random(seed)
        suffix_pages = suffix_tokens // PAGE_SIZE
        spare = 4 * (PROMPT_TOKENS // PAGE_SIZE)
        system_pages = SYSTEM_PROMPT_TOKENS // PAGE_SIZE
        self.allocator = PageAllocator(
            num_system * system_pages + num_prompts * suffix_pages + spare
        )
        self.index = PrefixIndex(PAGE_SIZE, self.allocator)
        self.system_prompts = [self.random_tokens(SYSTEM_PROMPT_TOKENS) for _ in range(num_system)]
        self.system_pages: list[list[int]] = []
        for tokens in self.system_prompts:
            pages = self.take(system_pages)
            self.publish(tokens, pages)
            self.allocator.decref(pages)
            self.system_pages.append(pages)
        for number in range(num_prompts):
            which = number % num_system
            own = self.take(suffix_pages)
            tokens = self.system_prompts[which] + self.random_tokens(suffix_tokens)
            self.publish(tokens, self.system_pages[which] + own)
            self.allocator.decref(own)

    def publish(self, tokens: list[int], pages: list[int]) -> None:
        """Cache a prompt's pages the way the engine does: extend an empty match, unpin."""
        self.index.unpin(self.index.extend(self.index.match(tokens, 0), tokens, pages))

    def take(self, num_pages: int) -> list[int]:
        pages = self.allocator.allocate(num_pages)
        if pages is None:
            raise RuntimeError(f"benchmark pool ran out of pages allocating {num_pages}")
        return pages

    def random_tokens(self, count: int) -> list[int]:
        # Random uint16 ids straight from random bytes: a per-token Python loop would dominate.
        return array("H", self.rng.randbytes(2 * count)).tolist()

    def new_prompt(self) -> list[int]:
        which = self.rng.randrange(len(self.system_prompts))
        suffix = self.random_tokens(PROMPT_TOKENS - SYSTEM_PROMPT_TOKENS)
        return self.system_prompts[which] + suffix

    def match_us(self, tokens: list[int], repeats: int) -> tuple[float, int]:
        """Median microseconds of `match(tokens)` (unpinned after each, untimed); hit tokens."""
        timings = []
        hit = 0
        for _ in range(repeats):
            start = time.perf_counter_ns()
            match = self.index.match(tokens)
            timings.append((time.perf_counter_ns() - start) / 1e3)
            hit = match.num_tokens
            self.index.unpin(match)
        return statistics.median(timings), hit

    def insert_us(self, repeats: int) -> tuple[float, float, int]:
        """Median microseconds to insert a new prompt's pages, and to match it fully after.

        After each round the prompt is unpinned and as many LRU pages are evicted as were
        inserted, so every round sees an index of the same size.
        """
        insert_timings = []
        full_match_timings = []
        new_pages = 0
        for _ in range(repeats):
            tokens = self.new_prompt()
            which = self.system_prompts.index(tokens[:SYSTEM_PROMPT_TOKENS])
            own = self.take(PROMPT_TOKENS // PAGE_SIZE - len(self.system_pages[0]))
            pages = self.system_pages[which] + own
            start = time.perf_counter_ns()
            self.publish(tokens, pages)
            insert_timings.append((time.perf_counter_ns() - start) / 1e3)
            self.allocator.decref(own)
            new_pages = len(own)
            start = time.perf_counter_ns()
            match = self.index.match(tokens)
            full_match_timings.append((time.perf_counter_ns() - start) / 1e3)
            if match.num_tokens != PROMPT_TOKENS:
                raise RuntimeError(f"published prompt hit only {match.num_tokens} tokens")
            self.index.unpin(match)
            freed = self.index.evict(new_pages)
            if len(freed) != new_pages:
                raise RuntimeError(f"evicted {len(freed)} pages, expected {new_pages}")
        return statistics.median(insert_timings), statistics.median(full_match_timings), new_pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--system-prompts", type=int, default=64)
    parser.add_argument("--suffix-tokens", type=int, default=64, help="unique tokens per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pairs_per_s = bench_allocate_free(pairs=200_000, runs=7)
    verdict = "ok" if pairs_per_s >= ALLOC_FREE_TARGET else "BELOW TARGET"
    print(f"allocate+free: {pairs_per_s:,.0f} pairs/s (target >= {ALLOC_FREE_TARGET:,}) {verdict}")

    start = time.perf_counter()
    bench = IndexBench(args.prompts, args.system_prompts, args.suffix_tokens, args.seed)
    build_s = time.perf_counter() - start
    # The tree is long-lived: keep the cyclic GC from rescanning it during the timings.
    gc.collect()
    gc.freeze()
    print(
        f"index: {args.prompts:,} prompts over {args.system_prompts} system prompts, "
        f"{bench.index.num_cached_pages():,} cached pages, built in {build_s:.1f} s"
    )

    match_us, hit = bench.match_us(bench.new_prompt(), repeats=2_000)
    verdict = "ok" if match_us <= MATCH_TARGET_US else "ABOVE TARGET"
    print(
        f"match, {PROMPT_TOKENS}-token prompt, shared system prompt + new suffix: "
        f"{match_us:.1f} us median ({hit} tokens hit; target <= {MATCH_TARGET_US:.0f} us) "
        f"{verdict}"
    )
    insert_us, full_match_us, new_pages = bench.insert_us(repeats=200)
    print(
        f"publish (extend + unpin), new {PROMPT_TOKENS}-token prompt ({new_pages} new pages): "
        f"{insert_us:.1f} us median"
    )
    print(f"match, {PROMPT_TOKENS}-token prompt fully cached: {full_match_us:.1f} us median")
    bench.index.check_invariants()
    bench.allocator.check_invariants()


if __name__ == "__main__":
    main()
