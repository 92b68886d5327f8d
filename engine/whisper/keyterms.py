"""Keyterms: words a stream expects (names, products, jargon), favoured while decoding.

An utterance's `keyterms` reach the decoder two ways, and `engine.whisper.recognizer` uses
both (bench/keyterms.py: the prompt does most of the work, boosting finishes terms begun;
docs/performance.md#keyterms):

- **In the prompt**: Whisper's previous-text prefix (<|startofprev|>) reads the terms
  (at most `PROMPT_TOKENS` of them) before the utterance's own previous text, so the
  model has seen their spelling; they are there whether or not previous text is
  (`prompt_tokens`).
- **Boosting** (shallow fusion with a list, no language model): the terms' token
  sequences (each as the model writes it after a space) form a prefix tree. At every
  decoding step each row's logits get a bonus: `START` on the first token of every term
  (a term may begin at any word), `CONTINUE` on the next token of each term the row's
  last tokens are partway through. Greedy decoding then takes a term where the audio made
  it nearly as likely as what the model would have written, and, once it has begun one,
  finishes it rather than drifting to a sound-alike. Once a row has written a term, that
  term's first token gets no more `START` bonus in the row (it continues one begun as
  before): a bonus on beginning it again made tiny.en loop ("Istio, Istio, ..."). A term
  that is not said gets a bonus
  that does not overcome a clearly better word: the bonuses are bounded so that it is not
  inserted (bench/keyterms.py's unrelated-terms check).

`TermTrie` is the prefix tree of one request's terms; `Boost` holds a batch's tries and
each row's place in its own, and turns them into a (rows, vocabulary) bias for
`engine.whisper.vocabulary`'s choice. Rows without terms get no bias: a row decodes the same
beside rows with other terms or none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The logit bonuses (the one pair measured: bench/keyterms.py --grid tries others).
START = 2.0
CONTINUE = 4.0
# The most tokens of an utterance's terms that are boosted (the first terms' first; the
# server bounds the list before: wire/keyterms.py).
MAX_TOKENS = 500
# The most tokens of an utterance's terms read in its prompt, a room of their own: the
# previous text's `prompt_tokens` (0 on the server by default) does not bound them.
PROMPT_TOKENS = 128

State = tuple[int, ...]  # the trie nodes a row's last tokens reach (root excluded)
Written = frozenset[int]  # the end nodes of the terms a row has written


class TermTrie:
    """The prefix tree of the terms' token sequences. Node 0 is the root."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        self._children: list[dict[int, int]] = [{}]
        # The end nodes of the terms beginning with each first token.
        self._ends: dict[int, set[int]] = {}
        for sequence in sequences:
            node = 0
            for token in sequence:
                child = self._children[node].get(token)
                if child is None:
                    child = len(self._children)
                    self._children.append({})
                    self._children[node][token] = child
                node = child
            if sequence:
                self._ends.setdefault(sequence[0], set()).add(node)
        self._all_ends = frozenset(end for ends in self._ends.values() for end in ends)

    def __len__(self) -> int:
        """How many nodes below the root (tokens of the terms, shared prefixes once)."""
        return len(self._children) - 1

    def bonuses(
        self,
        state: State,
        start: float = START,
        go_on: float = CONTINUE,
        written: Written = frozenset(),
    ) -> dict[int, float]:
        """Each favoured token's bonus after a row's tokens reached `state`: `start` for
        the first token of a term not `written` yet, `go_on` for the next token of a term
        begun."""
        out = {token: start for token, ends in self._ends.items() if not ends <= written}
        for node in state:
            for token in self._children[node]:
                out[token] = max(out.get(token, 0.0), go_on)
        return out

    def written(self, state: State, token: int) -> set[int]:
        """The end nodes of the terms `token` completes after `state`."""
        ends = set()
        for node in (0, *state):
            child = self._children[node].get(token)
            if child is not None and child in self._all_ends:
                ends.add(child)
        return ends

    def advance(self, state: State, token: int) -> State:
        """The state after `token`: the terms begun or continued by it that go on."""
        reached = []
        for node in (0, *state):
            child = self._children[node].get(token)
            if child is not None and self._children[child] and child not in reached:
                reached.append(child)
        return tuple(reached)


class Boost:
    """A batch's tries (None: a row without terms) and each row's state, for a head of
    `vocabulary` logits."""

    def __init__(
        self,
        tries: Sequence[TermTrie | None],
        vocabulary: int,
        *,
        start: float = START,
        go_on: float = CONTINUE,
    ) -> None:
        self._tries = list(tries)
        self._states: list[State] = [() for _ in self._tries]
        self._written: list[Written] = [frozenset() for _ in self._tries]
        self._vocabulary = vocabulary
        self._start = start
        self._go_on = go_on

    def __len__(self) -> int:
        return len(self._tries)

    def _row(
        self, trie: TermTrie | None, state: State, written: Written, out: torch.Tensor
    ) -> None:
        if trie is None:
            return
        for token, bonus in trie.bonuses(state, self._start, self._go_on, written).items():
            if token < self._vocabulary:
                out[token] = bonus

    def bias(self, device: torch.device) -> torch.Tensor:
        """Every row's bias at its current state, (rows, vocabulary)."""
        out = torch.zeros(len(self._tries), self._vocabulary, device=device)
        for i, trie in enumerate(self._tries):
            self._row(trie, self._states[i], self._written[i], out[i])
        return out

    def along(self, row: int, tokens: Sequence[int], device: torch.device) -> torch.Tensor:
        """Row `row`'s bias before each of `tokens` and after the last, were it to take
        them (its state unchanged): (len(tokens) + 1, vocabulary)."""
        out = torch.zeros(len(tokens) + 1, self._vocabulary, device=device)
        trie, state, written = self._tries[row], self._states[row], self._written[row]
        if trie is None:
            return out
        for k in range(len(tokens) + 1):
            self._row(trie, state, written, out[k])
            if k < len(tokens):
                written = written | trie.written(state, tokens[k])
                state = trie.advance(state, tokens[k])
        return out

    def advance(self, row: int, tokens: Sequence[int]) -> None:
        """Row `row` took `tokens`."""
        trie = self._tries[row]
        if trie is None:
            return
        state, written = self._states[row], self._written[row]
        for token in tokens:
            written = written | trie.written(state, token)
            state = trie.advance(state, token)
        self._states[row], self._written[row] = state, written


def boost_for(
    terms: Sequence[Sequence[Sequence[int]]],
    vocabulary: int,
    *,
    start: float = START,
    go_on: float = CONTINUE,
) -> Boost | None:
    """The batch's `Boost` for each row's terms' token sequences, or None when no row has
    any, or both bonuses are 0 (decoding then takes no bias at all)."""
    if not any(terms) or start == go_on == 0:
        return None
    tries = [TermTrie(row) if row else None for row in terms]
    return Boost(tries, vocabulary, start=start, go_on=go_on)
