from __future__ import annotations

import random

import pytest
from engine.stop_reference import prefix_texts, vllm_stop

from astrai_batch.engine.sampling.stop_strings import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    StopStringMatcher,
    StopStringTracker,
    window_decoder,
)
from astrai_batch.errors import ConfigError

# -- StopStringMatcher -------------------------------------------------------------------------


def test_find_returns_the_start_of_the_stop_string() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.find("answer: 42\n### next") == 11
    assert matcher.find("answer: 42") is None


def test_earliest_start_wins_among_overlapping_stops() -> None:
    matcher = StopStringMatcher(["bc", "abcd", "d"])
    assert matcher.find("xxabcdyy") == 2
    assert StopStringMatcher(["cd", "bcd"]).find("abcd") == 1


def test_stop_spanning_the_checked_boundary_is_found() -> None:
    matcher = StopStringMatcher(["world"])
    assert matcher.find("hello wor", 0) is None
    assert matcher.find("hello world", 9) == 6


def test_stop_wholly_in_the_checked_part_is_not_reported_again() -> None:
    matcher = StopStringMatcher(["stop"])
    assert matcher.find("stop here", 9) is None
    assert matcher.find("stop here", 4) is None
    assert matcher.find("stop here", 3) == 0


def test_max_stop_len_and_duplicates() -> None:
    matcher = StopStringMatcher(["ab", "xyz", "ab"])
    assert matcher.stops == ("ab", "xyz")
    assert matcher.max_stop_len == 3
    assert StopStringMatcher([]).max_stop_len == 0
    assert StopStringMatcher([]).find("anything", 0) is None


def test_matcher_validation() -> None:
    with pytest.raises(ConfigError) as raised:
        StopStringMatcher(["ok", ""])
    assert str(raised.value) == "stop must contain only non-empty strings, got ''"
    with pytest.raises(ConfigError) as raised:
        StopStringMatcher("###")
    assert str(raised.value) == "stop must be a sequence of strings, got the string '###'"
    with pytest.raises(ValueError) as raised:
        StopStringMatcher(["a"]).find("abc", 4)
    assert str(raised.value) == "start must be in [0, 3], got 4"


def first_stop_by_brute_force(chunks: list[str], stops: list[str]) -> tuple[int, int] | None:
    """(chunk index, cut) of the first chunk after which the text contains a stop string."""
    text = ""
    for index, chunk in enumerate(chunks):
        text += chunk
        starts = [i for i in range(len(text)) for stop in stops if text.startswith(stop, i)]
        if starts:
            return index, min(starts)
    return None


def first_stop_incrementally(chunks: list[str], stops: list[str]) -> tuple[int, int] | None:
    matcher = StopStringMatcher(stops)
    text = ""
    for index, chunk in enumerate(chunks):
        checked = len(text)
        text += chunk
        cut = matcher.find(text, checked)
        if cut is not None:
            return index, cut
    return None


@pytest.mark.parametrize("seed", range(5))
def test_incremental_search_never_misses_a_match(seed: int) -> None:
    rng = random.Random(seed)
    found = 0
    for _ in range(300):
        alphabet = "abc"
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        chunks = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 12))
        ]
        expected = first_stop_by_brute_force(chunks, stops)
        assert first_stop_incrementally(chunks, stops) == expected, (stops, chunks)
        found += expected is not None
    # Both outcomes occur, so the comparison is not vacuous.
    assert 0 < found < 300


class ChunkTokenizer:
    """Token id i decodes to chunks[i]; a sequence decodes to their concatenation."""

    def __init__(self, chunks: list[str]) -> None:
        self.chunks = chunks

    def decode(self, token_ids, skip_special_tokens, clean_up_tokenization_spaces):
        return "".join(self.chunks[i] for i in token_ids)


@pytest.mark.parametrize("seed", range(3))
def test_tracker_searches_only_new_text_and_a_tail(seed: int) -> None:
    rng = random.Random(seed)
    found = 0
    for _ in range(200):
        stops = [
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        chunks = [
            "".join(rng.choice("abc") for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 12))
        ]
        output = StopStringTracker(ChunkTokenizer(chunks), tuple(stops), min_tokens=0)
        got = None
        for index in range(len(chunks)):
            if output.append(index):
                got = (index, output.cut)
                break
        expected = first_stop_by_brute_force(chunks, stops)
        assert got == expected, (stops, chunks)
        found += got is not None
    assert 0 < found < 200


# -- IncrementalDetokenizer --------------------------------------------------------------------

MIXED_TEXT = "héllo wörld 你好 🙂 ok"


class RecordingTokenizer:
    """The real tokenizer, remembering how many ids each decode call was given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.window_sizes: list[int] = []

    def decode(self, token_ids, skip_special_tokens, clean_up_tokenization_spaces):
        self.window_sizes.append(len(token_ids))
        return self.tokenizer.decode(
            token_ids,
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
        )


def feed(detokenizer: IncrementalDetokenizer, token_ids: list[int]) -> list[str]:
    return [detokenizer.append(token_id) for token_id in token_ids]


def test_multibyte_characters_split_across_tokens(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode(MIXED_TEXT)
    assert len(ids) > len(MIXED_TEXT)  # some characters span several byte tokens
    detokenizer = IncrementalDetokenizer(tiny_tokenizer)
    pieces = feed(detokenizer, ids)
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces)
    assert "".join(pieces) == MIXED_TEXT
    assert detokenizer.text == MIXED_TEXT
    assert detokenizer.full_text == MIXED_TEXT
    assert "" in pieces  # tokens that end inside a character were held back
    assert detokenizer.num_tokens == len(ids)
    detokenizer.check_invariants()


def test_held_back_text_is_in_full_text_only(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode("a🙂")
    detokenizer = IncrementalDetokenizer(tiny_tokenizer)
    feed(detokenizer, ids[:-1])
    assert detokenizer.text == "a"
    assert detokenizer.full_text == tiny_tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert detokenizer.full_text.endswith(REPLACEMENT_CHAR)
    assert detokenizer.append(ids[-1]) == "🙂"
    assert detokenizer.text == "a🙂"


@pytest.mark.parametrize("seed", range(4))
def test_random_token_sequences_decode_like_the_tokenizer(tiny_tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    vocab = len(tiny_tokenizer)
    for _ in range(40):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        detokenizer = IncrementalDetokenizer(tiny_tokenizer)
        emitted = ""
        for count, token_id in enumerate(ids, start=1):
            emitted += detokenizer.append(token_id)
            expected = tiny_tokenizer.decode(ids[:count], skip_special_tokens=True)
            assert detokenizer.full_text == expected
            assert detokenizer.text == emitted
            assert expected.startswith(emitted)
            detokenizer.check_invariants()


def test_special_tokens_are_skipped(tiny_tokenizer) -> None:
    hello = tiny_tokenizer.encode("hello")
    ids = [*hello[:1], tiny_tokenizer.eos_token_id, *hello[1:], tiny_tokenizer.bos_token_id]
    detokenizer = IncrementalDetokenizer(tiny_tokenizer)
    feed(detokenizer, ids)
    assert detokenizer.full_text == "hello"
    assert detokenizer.text == "hello"


def test_decoding_window_stays_small(tiny_tokenizer) -> None:
    text = " ".join([MIXED_TEXT, "The quick brown fox jumps over the lazy dog."] * 20)
    ids = tiny_tokenizer.encode(text)
    recording = RecordingTokenizer(tiny_tokenizer)
    detokenizer = IncrementalDetokenizer(recording)
    feed(detokenizer, ids)
    assert detokenizer.text == text
    assert len(ids) > 400
    # The widest window is 好 (three byte tokens) after its prefix 你 (three more): the
    # window spans two characters at most, however long the text.
    assert max(recording.window_sizes) == 6


def test_prompt_context_continues_the_prompt(tiny_tokenizer) -> None:
    prompt = tiny_tokenizer.encode("Once upon a time")
    completion = tiny_tokenizer.encode(" there was 你好")
    detokenizer = IncrementalDetokenizer(tiny_tokenizer, prompt)
    feed(detokenizer, completion)
    assert detokenizer.text == " there was 你好"
    whole = tiny_tokenizer.decode(prompt + completion, skip_special_tokens=True)
    assert detokenizer.text == whole[len(tiny_tokenizer.decode(prompt)) :]


def assert_windows_decode_like_the_tokenizer(tokenizer, seed: int) -> None:
    decode = window_decoder(tokenizer)
    rng = random.Random(seed)
    vocab = len(tokenizer)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
        expected = tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert decode(ids) == expected, ids


def test_window_decoder_equals_decode_on_stock_fast_tokenizers(tiny_tokenizer) -> None:
    for seed, tokenizer in enumerate([tiny_tokenizer, metaspace_tokenizer()]):
        assert_windows_decode_like_the_tokenizer(tokenizer, seed)


def test_window_decoder_keeps_a_tokenizers_own_decoding(tiny_tokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    shouting = Shouting(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    ids = tiny_tokenizer.encode("hello there")
    assert window_decoder(shouting)(ids) == "HELLO THERE"
    recording = RecordingTokenizer(tiny_tokenizer)  # no Rust tokenizer of its own
    assert window_decoder(recording)(ids) == "hello there"
    assert recording.window_sizes == [len(ids)]


@pytest.mark.slow
def test_window_decoder_equals_decode_on_smollm2() -> None:
    from astrai_batch.engine.model.loader import load_model

    assert_windows_decode_like_the_tokenizer(load_model("smollm2-135m").tokenizer, 7)


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace: '▁' marks spaces, the first is dropped)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"], show_progress=False)
    corpus = ["the quick brown fox jumps over the lazy dog", "a time of tokens and spaces"]
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


def test_sentencepiece_style_spaces_match_whole_decoding() -> None:
    tokenizer = metaspace_tokenizer()
    ids = tokenizer.encode("the lazy dog jumps over a brown fox")
    assert tokenizer.convert_ids_to_tokens(ids)[0].startswith("▁")
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = feed(detokenizer, ids)
    assert pieces[0] == "the"
    assert detokenizer.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert detokenizer.text == "the lazy dog jumps over a brown fox"


# -- StopStringTracker: min_tokens holds stop strings off ------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_tracker_stops_where_vllm_does_with_min_tokens(tiny_tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    # Tokens that decode to short plain ASCII, so whole-prefix decodes are the stable text.
    plain = [
        token_id
        for token_id in range(3, len(tiny_tokenizer))
        if (text := tiny_tokenizer.decode([token_id])).isascii() and text.isprintable()
    ]
    stopped = 0
    for _ in range(60):
        ids = [rng.choice(plain) for _ in range(rng.randint(1, 12))]
        texts = prefix_texts(tiny_tokenizer, ids)
        full = texts[-1]
        start = rng.randrange(len(full))
        stop = full[start : start + rng.randint(1, 4)]
        min_tokens = rng.randint(0, len(ids))
        tracker = StopStringTracker(tiny_tokenizer, [stop], min_tokens)
        got = None
        for count, token_id in enumerate(ids, start=1):
            if tracker.append(token_id):
                got = (count, tracker.text)
                break
        assert got == vllm_stop(texts, stop, min_tokens), (ids, stop, min_tokens)
        stopped += got is not None
    assert 0 < stopped < 60  # both outcomes occur
