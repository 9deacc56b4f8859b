"""Scheduler decisions with exact expectations (no model: the cache and sequences only)."""

from __future__ import annotations

from engine_reference import make_sequence

from astrai_batch.cache import CacheStats, KVCacheManager
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.scheduler import Scheduler
from astrai_batch.engine.sequences.sequence import Sequence

PAGE = 4


def make_seq(seq_id: int, tokens: list[int], arrival: int | None = None) -> Sequence:
    return make_sequence(seq_id, tokens, page_size=PAGE, arrival=arrival)


def run_step(scheduler: Scheduler) -> list[tuple[int, int]]:
    out = scheduler.schedule()
    scheduler.after_step(out.work)
    return [(w.seq.seq_id, w.num_tokens) for w in out.work]


def cache_prompt(cache: KVCacheManager, tokens: list[int]) -> None:
    cache.open("warm", tokens, len(tokens))
    assert cache.reserve("warm", len(tokens))
    cache.close("warm", tokens)


def test_longest_cached_prefix_is_admitted_first():
    cache = KVCacheManager(num_pages=64, page_size=PAGE)
    cache_prompt(cache, list(range(100, 116)))  # 4 pages cached
    scheduler = Scheduler(EngineConfig(page_size=PAGE, max_num_seqs=1), cache)
    scheduler.add(make_seq(0, [1, 2, 3, 4, 5, 6]))  # nothing cached, arrived first
    scheduler.add(make_seq(1, [*range(100, 112), 7, 8]))  # 3 pages cached
    scheduler.add(make_seq(2, [*range(100, 108), 9]))  # 2 pages cached
    assert run_step(scheduler) == [(1, 2)]  # only the 2 uncached tokens are computed
    assert scheduler.running[0].cached_tokens == 12


def test_duplicate_prefix_waits_for_the_sequence_computing_it():
    cache = KVCacheManager(num_pages=64, page_size=PAGE)
    scheduler = Scheduler(EngineConfig(page_size=PAGE, max_num_batched_tokens=64), cache)
    shared = list(range(10, 22))  # 3 pages nobody has computed yet
    scheduler.add(make_seq(0, [*shared, 1, 2]))
    scheduler.add(make_seq(1, [*shared, 3, 4]))
    scheduler.add(make_seq(2, [50, 51, 52, 53, 54]))
    assert run_step(scheduler) == [(0, 14), (2, 5)]  # seq 1 waits for seq 0's pages
    assert run_step(scheduler) == [(1, 2)]  # then hits them: 12 cached, 2 computed
    assert scheduler.running[-1].cached_tokens == 12


def test_an_aged_sequence_still_waits_for_in_flight_pages():
    # The shared-prefix bench computed 8% more prefill than the ideal when aged sequences
    # skipped this wait and computed their group's system prompt a second time.
    cache = KVCacheManager(num_pages=64, page_size=PAGE)
    config = EngineConfig(page_size=PAGE, max_num_batched_tokens=8, max_wait_steps=1)
    scheduler = Scheduler(config, cache)
    shared = list(range(10, 22))  # 3 pages, more than one step's budget
    scheduler.add(make_seq(0, [*shared, 1, 2]))
    assert run_step(scheduler) == [(0, 8)]
    late = make_seq(1, [*shared, 3, 4])
    scheduler.add(late)
    late.admissions_waited = 5  # aged
    assert run_step(scheduler) == [(0, 6)]  # seq 1 still waits: page 3 is in flight
    assert run_step(scheduler) == [(1, 2)]  # then hits all 3 pages
    assert late.cached_tokens == 12


def test_a_sequence_passed_over_too_often_goes_first():
    cache = KVCacheManager(num_pages=64, page_size=PAGE)
    cache_prompt(cache, list(range(100, 108)))
    config = EngineConfig(page_size=PAGE, max_num_seqs=1, max_wait_steps=2)
    scheduler = Scheduler(config, cache)
    old = make_seq(0, [1, 2, 3])
    scheduler.add(old)
    old.admissions_waited = 2  # passed over twice already
    scheduler.add(make_seq(1, [*range(100, 108), 5]))
    assert run_step(scheduler) == [(0, 3)]


def test_out_of_pages_preempts_the_newest_and_it_resumes_first():
    cache = KVCacheManager(num_pages=4, page_size=PAGE)
    scheduler = Scheduler(EngineConfig(page_size=PAGE, max_num_batched_tokens=64), cache)
    first = make_seq(0, [1, 2, 3, 4, 5, 6, 7])  # 2 pages
    second = make_seq(1, [8, 9, 10, 11, 12, 13, 14])  # 2 pages
    scheduler.add(first)
    scheduler.add(second)
    assert run_step(scheduler) == [(0, 7), (1, 7)]
    for seq in (first, second):
        seq.tokens.append(99)  # as if sampled
    first.tokens.append(98)
    first.num_computed = len(first.tokens) - 1  # first needs a third page next step
    out = scheduler.schedule()
    assert out.preempted == 1
    assert [(w.seq.seq_id, w.num_tokens) for w in out.work] == [(0, 1)]
    assert scheduler.waiting == [second]
    assert second.num_computed == 0 and second.was_preempted
    cache.check_invariants()


def test_refused_admissions_and_returns_after_preemption_count_no_lookup():
    # The figures: a 24-token prompt refused twice, then admitted, was counted three
    # times (72 missed tokens); it is one lookup of 24 missed tokens.
    cache = KVCacheManager(num_pages=8, page_size=PAGE)
    scheduler = Scheduler(EngineConfig(page_size=PAGE, max_num_batched_tokens=64), cache)
    running = make_seq(0, list(range(100, 120)))  # 5 of the 8 pages
    late = make_seq(1, list(range(200, 224)))  # needs 6 pages
    scheduler.add(running)
    scheduler.add(late)
    assert run_step(scheduler) == [(0, 20)]  # late is opened, refused pages, closed
    assert run_step(scheduler) == []  # and again
    assert cache.stats() == CacheStats(
        lookups=1,
        hit_tokens=0,
        missed_tokens=20,
        inserted_pages=5,
        pages_in_use=5,
        cached_pages=5,
        peak_pages_in_use=5,
    )
    scheduler.finish(running)
    assert run_step(scheduler) == [(1, 24)]  # 3 free pages + 3 of running's evicted
    stats = cache.stats()
    assert (stats.lookups, stats.hit_tokens, stats.missed_tokens) == (2, 0, 44)
    assert (stats.evicted_pages, stats.peak_pages_in_use) == (3, 6)

    # Preempted and admitted again: the return hits the pages it published, but the
    # sequence's lookup was counted at its first admission, so nothing is added.
    late.tokens.extend([7] * 9)  # as if sampled: it now needs 9 pages, the pool has 8
    assert scheduler.schedule().preempted == 1
    late.tokens[24:] = [7]
    assert run_step(scheduler) == [(1, 1)]
    assert late.cached_tokens == 0
    stats = cache.stats()
    assert (stats.lookups, stats.hit_tokens, stats.missed_tokens) == (2, 0, 44)
    cache.check_invariants()
