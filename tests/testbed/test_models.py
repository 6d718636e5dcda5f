"""The taught target's corpus (testbed/models.py): the word
chains bench/drafter_loop.py's target learns. Pure Python, no torch."""

from collections import Counter
from itertools import pairwise

from testbed.models import (
    _WORDS,
    CHAIN_FIRST,
    CHAIN_SECOND,
    chain_corpus,
    domains,
    successor_table,
)


def test_the_two_domains_split_the_vocabulary():
    d = domains()
    assert set(d) == {"code", "prose"}
    assert not set(d["code"]) & set(d["prose"])
    assert sorted(d["code"] + d["prose"]) == sorted(_WORDS)


def test_successors_stay_in_their_domain_and_are_seeded():
    table = successor_table()
    assert table == successor_table() and table != successor_table(seed=7)
    for words in domains().values():
        for w in words:
            first, second = table[w]
            assert first in words and second in words and len({w, first, second}) == 3


def test_the_corpus_follows_the_first_successor_at_its_stated_rate():
    table = successor_table()
    follows = Counter()
    for line in chain_corpus(sentences=500):
        words = line.split()
        home = next(ws for ws in domains().values() if words[0] in ws)
        assert all(w in home for w in words)  # a walk never leaves its domain
        for prev, nxt in pairwise(words):
            follows["first" if nxt == table[prev][0] else "second" if nxt == table[prev][1] else "other"] += 1
    total = sum(follows.values())
    assert abs(follows["first"] / total - CHAIN_FIRST) < 0.03
    assert abs(follows["second"] / total - CHAIN_SECOND) < 0.03
    assert chain_corpus(sentences=20) == chain_corpus(sentences=20)
