"""Keyterm boosting: the prefix tree over the terms' tokens, the per-row bias it gives,
and the heads' choice under it (synthetic logits)."""

from __future__ import annotations

import torch

from engine.whisper.keyterms import Boost, TermTrie, boost_for
from engine.whisper.vocabulary import FullHead

# Two terms sharing their first token (10), a third of one token (20).
TERMS = [[10, 11, 12], [10, 13], [20]]


def test_the_trie_favours_term_starts_anywhere_and_continuations_once_begun() -> None:
    trie = TermTrie(TERMS)
    assert len(trie) == 5  # 10, 11, 12, 13, 20: the shared first token once
    assert trie.bonuses((), start=1.0, go_on=3.0) == {10: 1.0, 20: 1.0}
    begun = trie.advance((), 10)
    assert trie.bonuses(begun, start=1.0, go_on=3.0) == {10: 1.0, 20: 1.0, 11: 3.0, 13: 3.0}
    further = trie.advance(begun, 11)
    assert trie.bonuses(further, start=1.0, go_on=3.0) == {10: 1.0, 20: 1.0, 12: 3.0}
    # A finished term, a one-token term and a token off every term leave nothing begun.
    assert trie.advance(further, 12) == ()
    assert trie.advance((), 20) == ()
    assert trie.advance(begun, 99) == ()


def test_a_term_may_begin_again_while_one_is_partway() -> None:
    """Token 10 while a term begun with 10 is partway: that term is dropped (10 does not
    continue it) and a new one begins."""
    trie = TermTrie([[10, 10, 11]])
    once = trie.advance((), 10)
    twice = trie.advance(once, 10)
    assert len(twice) == 2  # the term at its second token, and begun again
    assert set(trie.bonuses(twice, start=1.0, go_on=3.0)) == {10, 11}


def test_the_bias_is_per_row_and_rows_without_terms_get_none() -> None:
    boost = Boost([TermTrie(TERMS), None], 32, start=1.0, go_on=3.0)
    bias = boost.bias(torch.device("cpu"))
    assert bias.shape == (2, 32)
    assert bias[0, 10] == 1.0 and bias[0, 20] == 1.0 and bias[0].count_nonzero() == 2
    assert bias[1].count_nonzero() == 0
    boost.advance(0, [10])
    assert boost.bias(torch.device("cpu"))[0, 11] == 3.0


def test_along_a_draft_gives_each_positions_bias_without_taking_it() -> None:
    boost = Boost([TermTrie(TERMS)], 32, start=1.0, go_on=3.0)
    along = boost.along(0, [10, 11], torch.device("cpu"))
    assert along.shape == (3, 32)
    assert along[0, 11] == 0.0 and along[1, 11] == 3.0 and along[2, 12] == 3.0
    assert boost.bias(torch.device("cpu"))[0, 11] == 0.0  # the row's state is unchanged


def test_no_boost_without_terms_or_bonuses() -> None:
    assert boost_for([[], []], 32) is None
    assert boost_for([TERMS], 32, start=0.0, go_on=0.0) is None
    assert boost_for([TERMS, []], 32) is not None


def test_a_bonus_tips_a_near_tie_but_not_a_clear_choice() -> None:
    """Synthetic logits through the head: the term's token wins where it was 1 logit
    behind, not where it was 10 behind; the log-probabilities are the biased
    distribution's."""
    vocabulary = 32
    projection = torch.nn.Linear(vocabulary, vocabulary, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.eye(vocabulary))
    head = FullHead(projection)
    states = torch.zeros(2, vocabulary)
    states[:, 5] = 10.0  # what the model would write
    states[0, 10] = 9.0  # the term's first token, a near tie
    states[1, 10] = 0.0  # far behind
    boost = Boost([TermTrie(TERMS), TermTrie(TERMS)], vocabulary, start=2.0, go_on=4.0)
    nothing = torch.zeros(0, dtype=torch.long)
    plain = head.choose(states, nothing)
    boosted = head.choose(states, nothing, boost.bias(torch.device("cpu")))
    assert plain.tokens.tolist() == [5, 5]
    assert boosted.tokens.tolist() == [10, 5]
    biased = states[0].clone()
    biased[[10, 20]] += 2.0
    assert boosted.logprobs[0] == torch.log_softmax(biased, -1)[10]


def test_a_term_written_gets_no_more_start_bonus_in_its_row() -> None:
    """After a row writes [20] (a whole term) token 20 is no longer favoured there (a
    bonus on beginning it again made tiny.en loop); 10 still is, and after [10, 13] it
    stays favoured, [10, 11, 12] not being written yet."""
    boost = Boost([TermTrie(TERMS), TermTrie(TERMS)], 32, start=1.0, go_on=3.0)
    boost.advance(0, [20])
    boost.advance(1, [10, 13])
    bias = boost.bias(torch.device("cpu"))
    assert bias[0, 20] == 0.0 and bias[0, 10] == 1.0
    assert bias[1, 10] == 1.0 and bias[1, 20] == 1.0
    boost.advance(1, [10, 11, 12])
    assert boost.bias(torch.device("cpu"))[1, 10] == 0.0
    # Along a draft the same holds, the row's own state unchanged.
    fresh = Boost([TermTrie(TERMS)], 32, start=1.0, go_on=3.0)
    along = fresh.along(0, [20, 5], torch.device("cpu"))
    assert along[0, 20] == 1.0 and along[1, 20] == 0.0 and along[2, 20] == 0.0
    assert fresh.bias(torch.device("cpu"))[0, 20] == 1.0
