"""The vocabulary projection and the greedy choice of a token: in full, or from an int8
shortlist rescored in float32 (float32's tokens at about int8's price).

On the CPU a float32 decoder step of tiny.en costs ~14 ms at batch 1, ~9 ms of it the
vocabulary projection (51,864 × 384 floats, 80 MB read per step). Greedy decoding needs
only the argmax of those logits and the chosen token's log-probability, not every logit
exactly. `ShortlistHead` therefore:

1. computes approximate logits for the whole vocabulary with the per-row int8 kernel
   (`engine.whisper.int8.Int8Linear`: ~1.4 ms, a row's result independent of its batch), with the
   suppressed tokens at -inf;
2. takes each row's `size` best candidates there (the shortlist, 32 by default);
3. recomputes those candidates' logits exactly in float32 (their rows of the tied token
   embedding, one small product per row) and picks the best of them;
4. vouches for the pick: a token outside the shortlist has an int8 logit at most the
   shortlist's last, so its float32 logit is at most that plus the int8 error. On the
   corpus that error never exceeded 1.63 (40 million logits of decoder states after the
   final layer norm, whose norm hardly varies:
   docs/history/2026-12-02-step-cost-and-endpoint.md#int8-shortlist-float32-rescoring-enginevocabularypy-the-cpu-default).
   A row whose best exact logit does not beat the shortlist's last int8 logit by `margin`
   (4.0, 2.5 times that) is projected again in full float32 ("rescued"), so float32's
   argmax is missed only if int8 errs by more than that. On the corpus float32's token was
   always at rank 0 or 1 of the int8 logits, and 0.15 % of the choices were rescued. (A
   margin of 0.08 times the row's largest magnitude, tried first, rescued 4 %, each
   costing a float32 projection of its own.)

What the rest of the decoder reads, and how it stays right:

- **Tokens** (greedy choice, draft verification in `engine.whisper.greedy`): float32's, as above.
  Every step of the choice is computed per row, so a row's token and log-probability are
  bit for bit the same alone and in any batch (given the same decoder states).
- **Log-probabilities** (average log-probability for the hallucination guard
  `engine.whisper.guard`, word probabilities in `engine.whisper.alignment`): the chosen
  token's exact logit minus the log-sum-exp over the int8 logits with the shortlist's exact
  values put in place. The top of the distribution, which holds nearly all of its mass, is
  exact; the rest is int8's, whose errors move the sum by a fraction of the remaining mass: on the
  corpus within 0.002 of float32's on average per utterance, and 0.06 for the worst
  single token, where much of the mass lay off the shortlist
  (tests/engine/test_vocabulary.py). Computing the normaliser exactly would take the full
  projection this saves.
- **Suppressed tokens** (Whisper's suppress lists, <|endoftext|> and the blank at the
  first position): -inf in the int8 logits, so never on a shortlist, as in float32.
- **The start step's logits** (`GreedyDecoder.start`: the no-speech probability and the
  language detection read every logit there): `logits()` is the full float32 projection,
  once per batch, not per step.

`FullHead` is the projection as it is (float32, or int8 under `int8-decoder`), every logit
computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch.nn import functional

from engine.whisper.int8 import Int8Linear

SHORTLIST = 32
# The shortlist's vouching margin in logits: 2.5 times the largest int8 logit error
# measured on the corpus (1.63, above).
MARGIN = 4.0


@dataclass(frozen=True, slots=True)
class Choice:
    """Greedy choices for rows of decoder states: each row's `tokens` and its
    `logprobs`, and which rows were `rescued` (projected in full because the shortlist
    could not vouch for its best; always False for `FullHead`)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    rescued: torch.Tensor


class VocabularyHead(Protocol):
    """The output projection of decoder states (after the final layer norm)."""

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Float32 logits for every token, (rows, vocabulary)."""
        ...

    def choose(
        self, states: torch.Tensor, suppress: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Choice:
        """The greedy choice for each of `states` (rows, d_model), the tokens in
        `suppress` (indices) excluded, `bias` (rows, vocabulary), if given, added to the
        logits first (keyterms, `engine.whisper.keyterms`): the log-probabilities are then the
        biased distribution's."""
        ...


class FullHead:
    """Every logit through the model's projection module, whatever its kind."""

    def __init__(self, projection: torch.nn.Module) -> None:
        self._projection = projection

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self._projection(states)
        return logits.float()

    def choose(
        self, states: torch.Tensor, suppress: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Choice:
        logits = self.logits(states)
        if bias is not None:
            logits += bias
        logits[:, suppress] = -torch.inf
        tokens, logprobs = pick(logits)
        return Choice(tokens, logprobs, torch.zeros_like(tokens, dtype=torch.bool))


class ShortlistHead:
    """Int8 shortlist, float32 rescoring (see the module doc). `projection` is the float32
    `nn.Linear` without bias (Whisper's, tied to the token embedding): its weight is kept,
    shared, and an int8 copy is made."""

    def __init__(
        self, projection: torch.nn.Linear, *, size: int = SHORTLIST, margin: float = MARGIN
    ) -> None:
        if projection.bias is not None:
            raise ValueError("the shortlist rescores a projection without bias")
        if not 1 <= size <= projection.out_features:
            raise ValueError(f"size must be in [1, {projection.out_features}], got {size}")
        self._weight: torch.Tensor = projection.weight.detach()
        self._int8: Int8Linear = Int8Linear(projection)
        self._size: int = size
        self._margin: float = margin

    @property
    def int8(self) -> Int8Linear:
        """The int8 projection the shortlist is drawn from (shareable: it holds no state
        between calls)."""
        return self._int8

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        return functional.linear(states.float(), self._weight)

    def choose(
        self, states: torch.Tensor, suppress: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Choice:
        states = states.float()
        approx = self._int8(states)
        if bias is not None:
            approx += bias
        approx[:, suppress] = -torch.inf
        shortlist = approx.topk(self._size, dim=-1)
        candidates = shortlist.indices  # (rows, size)
        # Each row's candidates exactly, row by row: (rows, size, d) times (rows, 1, d),
        # summed over d (not bmm, whose rounding depends on the batch).
        exact = (self._weight[candidates] * states[:, None, :]).sum(dim=-1)
        if bias is not None:
            exact += bias.gather(1, candidates)
        best, at = exact.max(dim=-1)
        tokens = candidates.gather(1, at[:, None])[:, 0]
        approx.scatter_(1, candidates, exact)
        logprobs = best - approx.logsumexp(dim=-1)
        rescued = shortlist.values[:, -1] + self._margin >= best
        # One rescued row at a time: a matrix product's rounding depends on its rows.
        for row in rescued.nonzero()[:, 0].tolist():
            full = self.logits(states[row : row + 1])
            if bias is not None:
                full += bias[row : row + 1]
            full[:, suppress] = -torch.inf
            tokens[row : row + 1], logprobs[row : row + 1] = pick(full)
        return Choice(tokens, logprobs, rescued)


def pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy choice per row of (rows, vocabulary) logits: the token and its log-probability."""
    picked = logits.argmax(dim=-1)
    chosen = logits.log_softmax(dim=-1).gather(1, picked[:, None])[:, 0]
    return picked, chosen
