"""Deterministic English-looking text for benchmark workloads, from a built-in word list.

Everything is drawn from a `random.Random` the caller seeds, using only `choice`, `randint`
and `sample`, whose results are the same across Python versions; nothing uses `hash()`.
Lengths are in words and approximate: a text stops at the first sentence boundary at or
past the requested count.
"""

from __future__ import annotations

import random

NOUNS = (
    "account", "answer", "apple", "area", "article", "bank", "book", "bridge", "budget",
    "building", "cache", "camera", "car", "card", "city", "class", "client", "cloud", "code",
    "company", "computer", "country", "customer", "data", "day", "decision", "design",
    "detail", "device", "door", "editor", "engine", "error", "event", "example", "face",
    "fact", "family", "farm", "field", "file", "forest", "friend", "game", "garden", "goal",
    "group", "guide", "hand", "history", "home", "hospital", "hour", "house", "idea", "image",
    "island", "issue", "job", "key", "kitchen", "lake", "language", "law", "leader", "letter",
    "library", "light", "list", "machine", "manager", "map", "market", "meeting", "memory",
    "message", "method", "model", "moment", "morning", "mountain", "music", "network",
    "number", "office", "order", "page", "paper", "party", "pattern", "people", "picture",
    "plan", "plant", "player", "point", "policy", "price", "problem", "process", "product",
    "program", "project", "question", "reader", "reason", "record", "report", "request",
    "result", "river", "road", "room", "rule", "school", "science", "season", "server",
    "service", "signal", "song", "source", "station", "story", "street", "student", "system",
    "table", "teacher", "team", "test", "theory", "ticket", "tool", "town", "train", "tree",
    "user", "value", "village", "voice", "water", "week", "window", "winter", "word", "world",
    "writer", "year",
)  # fmt: skip
ADJECTIVES = (
    "able", "active", "basic", "big", "blue", "brief", "bright", "busy", "calm", "careful",
    "central", "cheap", "clean", "clear", "close", "cold", "common", "complex", "current",
    "dark", "deep", "direct", "early", "easy", "empty", "exact", "fair", "famous", "fast",
    "final", "fine", "free", "fresh", "friendly", "full", "general", "gentle", "good", "great",
    "green", "happy", "heavy", "helpful", "high", "honest", "huge", "important", "large",
    "late", "light", "little", "local", "long", "loud", "main", "modern", "narrow", "new",
    "nice", "old", "open", "other", "patient", "plain", "polite", "popular", "private",
    "public", "quick", "quiet", "rare", "ready", "real", "recent", "red", "rich", "safe",
    "short", "simple", "slow", "small", "smart", "soft", "special", "strong", "sudden",
    "useful", "warm", "white", "whole", "wide", "wild", "young",
)  # fmt: skip
# Regular verbs only, so that the third person is spelled by rule.
VERBS = (
    "accept", "add", "answer", "ask", "build", "call", "carry", "change", "check", "choose",
    "clean", "collect", "compare", "connect", "count", "cover", "create", "describe", "design",
    "explain", "fill", "find", "finish", "fix", "follow", "gather", "guide", "help", "hold",
    "improve", "include", "join", "keep", "learn", "lift", "listen", "load", "mark", "measure",
    "move", "need", "open", "order", "paint", "pick", "plan", "print", "protect", "pull",
    "push", "reach", "read", "record", "repair", "report", "return", "save", "share", "show",
    "sort", "start", "store", "support", "test", "touch", "track", "train", "trust", "turn",
    "update", "use", "visit", "wash", "watch", "write",
)  # fmt: skip
ADVERBS = (
    "always", "carefully", "clearly", "closely", "daily", "early", "easily", "exactly",
    "finally", "gently", "often", "politely", "quickly", "quietly", "rarely", "really",
    "simply", "slowly", "soon", "today", "together", "usually",
)  # fmt: skip
PREPOSITIONS = (
    "about", "above", "across", "after", "along", "around", "at", "before", "behind",
    "below", "beside", "between", "by", "for", "from", "in", "inside", "near", "on", "over",
    "through", "under", "with", "without",
)  # fmt: skip
DETERMINERS = ("the", "a", "every", "each", "this", "that", "one", "our", "your")
ROLES = ("assistant", "guide", "teacher", "editor", "reviewer", "planner", "helper", "writer")


def third_person(verb: str) -> str:
    """'fix' -> 'fixes', 'carry' -> 'carries', 'read' -> 'reads' (regular verbs only)."""
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _with_article(determiner: str, rest: str) -> str:
    if determiner == "a" and rest[0] in "aeiou":
        return f"an {rest}"
    return f"{determiner} {rest}"


def noun_phrase(rng: random.Random) -> str:
    """'the quiet river', 'an open file', 'every report'."""
    noun = rng.choice(NOUNS)
    rest = f"{rng.choice(ADJECTIVES)} {noun}" if rng.randint(0, 1) else noun
    return _with_article(rng.choice(DETERMINERS), rest)


def _capitalize(text: str) -> str:
    return text[0].upper() + text[1:]


def statement(rng: random.Random) -> str:
    """One sentence of about 6-16 words."""
    pattern = rng.randint(0, 4)
    subject, obj, other = noun_phrase(rng), noun_phrase(rng), noun_phrase(rng)
    verb, verb2 = third_person(rng.choice(VERBS)), third_person(rng.choice(VERBS))
    adverb, prep = rng.choice(ADVERBS), rng.choice(PREPOSITIONS)
    if pattern == 0:
        text = f"{subject} {verb} {obj} {prep} {other}"
    elif pattern == 1:
        text = f"{subject} {adverb} {verb} {obj}, and {other} {verb2} it"
    elif pattern == 2:
        text = f"you should {rng.choice(VERBS)} {obj} {prep} {other} before it {verb2}"
    elif pattern == 3:
        text = f"when {subject} {verb} {obj}, {other} {verb2} {adverb}"
    else:
        text = f"{subject} {prep} {obj} {verb} {other} {adverb}"
    return _capitalize(text) + "."


def paragraph(rng: random.Random, words: int) -> str:
    """Sentences until at least `words` words."""
    sentences: list[str] = []
    count = 0
    while count < words:
        sentence = statement(rng)
        sentences.append(sentence)
        count += len(sentence.split())
    return " ".join(sentences)


def question(rng: random.Random, words: int) -> str:
    """One question of at least `words` words (at most 3 more), ending in '?'."""
    pattern = rng.randint(0, 4)
    subject, obj = noun_phrase(rng), noun_phrase(rng)
    verb = rng.choice(VERBS)
    if pattern == 0:
        text = f"how does {subject} {verb} {obj}"
    elif pattern == 1:
        text = f"why would {subject} {verb} {obj}"
    elif pattern == 2:
        text = f"what happens when {subject} {third_person(verb)} {obj}"
    elif pattern == 3:
        text = f"can you explain how {subject} {third_person(verb)} {obj}"
    else:
        text = f"which {rng.choice(NOUNS)} should I {verb} {rng.choice(PREPOSITIONS)} {obj}"
    parts = [text]
    count = len(text.split())
    while count < words:
        phrase = f"{rng.choice(PREPOSITIONS)} {noun_phrase(rng)}"
        if count + len(phrase.split()) > words + 3:
            phrase = rng.choice(ADVERBS)
        parts.append(phrase)
        count += len(phrase.split())
    return _capitalize(" ".join(parts)) + "?"


def persona(rng: random.Random, header: str) -> str:
    """The opening of a system prompt: `header` (which makes it distinct) and a role line."""
    role = f"{rng.choice(ADJECTIVES)} {rng.choice(ROLES)}"
    return f"{header} You are {_with_article('a', role)} for {noun_phrase(rng)}."
