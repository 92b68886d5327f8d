# One concept, 564 lines: greedy decoding of a batch; the passes that check drafts (the first
# and `_check_drafts`) share each row's cache, budget and choices with the single steps.
"""Greedy decoding of a batch, with drafts, over `engine.whisper.decoder_step`.

The decoder passes are `engine.whisper.decoder_step.DecoderStep`'s (the model's own layers over a
key/value cache, several times cheaper per step than transformers' `generate()` on CPU).
This module decides what each pass feeds and what is kept. Its tokens equal `generate()`'s
(tests/engine/test_greedy.py checks them on corpus speech).

One batch decodes in two calls:

- `start(hidden, prefixes)`: the decoder over each row's prefix (the previous text, if
  any) and <|startoftranscript|>. The `Started` batch it returns holds the logits there
  (where Whisper reads the no-speech probability and detects the language) and the
  batch's cache; the decoder object itself holds no batch.
- `decode(started, prompts, budgets, drafts)`: the rest of each row's prompt (language,
  task, <|notimestamps|>: the same length in every row) in one pass, then greedy tokens,
  with Whisper's suppressed tokens, until every row has its <|endoftext|> or has used its
  token budget. Returns the tokens and each one's log-probability.

Where every row's prompt is known before the logits at <|startoftranscript|> are read (an
English-only model, or languages pinned rather than detected), `start_and_decode` does
both: the prefix, <|startoftranscript|>, the prompt and the draft go through the decoder in
one pass, not three (the same tokens, less time per row:
docs/history/2026-12-02-evening-zen3.md#one-decoder-pass-for-the-start-greedydecoderstart_and_decode-kept-14b74ed).
Each pass reads every decoder weight once; for a few rows of a few tokens that read, more
than the arithmetic, is what a pass costs on the CPU.

Drafts (speculative decoding without a second model): a live utterance is transcribed
again every fraction of a second as it grows, and each transcription mostly repeats the
previous one's text. Given that text as a row's draft, one decoder pass over all drafts
tells which of their tokens greedy decoding would pick anyway, and its choice after them;
each row keeps those and decodes on from there, one step at a time. The passes drop from
one per token to about one per token the draft got wrong or lacked (a right draft: its one
pass, which also chooses the end). Rows then sit at different positions, which the cache
and the decoder step keep apart (`engine.whisper.decoder_step`). A draft that goes wrong at
one token (a partial's comma the final drops, a capital, a word spelled otherwise) is
mostly right after it: a row looks for each token it chooses itself in the next few tokens
of its draft (`_Rejoin`), and where it finds it, the next pass checks the rest of the draft
as the first did. A speculation whose partial differed from it by commas took 21 passes,
now 3 (docs/performance.md#a-flush-answered-from-a-speculation-benchttfs).

The vocabulary projection and the choice of each token are the `head`'s
(`engine.whisper.vocabulary`): every logit, or an int8 shortlist rescored in float32, whose
tokens are float32's. A position of a many-token pass is computed as a single step computes
it, up to the rounding of a product over more rows; so in float32 the tokens are greedy
decoding's whatever the drafts (27 of 27 corpus clips, each with drafts of its first 50, 70
and 85 %: finals identical to no draft). With int8 layers (`engine.whisper.int8`)
activations are quantized per row, so a pass's rows do not change each other's scales
(with the per-call scales of before, 6 of 27 clips differed by a word or a comma); the
rounding still tips a near tie now and then: of those clips' 81 int8 partials drafted by
half their text, 4 differ from their undrafted decoding ("books, which" against "books
which"), 3 of them as before the pass chose the token after a draft
(tests/engine/test_greedy.py).

Prompts of previous text (Whisper's `<|startofprev|>` prefix): `start` takes each row's
tokens before <|startoftranscript|>, of any length. Rows then start at different
positions, as after drafts: the cache's per-row lengths and masks keep every row's
attention on its own tokens, so a row decodes the same beside rows with other prompts
or none (tests/engine/test_prompts.py).

Forced text (left context, `engine.whisper.context`): a row's prompt after <|startoftranscript|>
may go on with text of its own (the transcript of audio at the start of its window), so
rows' prompts differ in length; `decode` takes each row's length and, as for prefixes,
each row decodes on from its own last prompt token.

Keyterms (`engine.whisper.keyterms`): a `Boost`, if given, adds each row's bias to its logits
at every choice (the first token, each draft position as if the draft's tokens before it
were taken, every step), and follows the tokens each row keeps.

What it does not do: beam search, temperature fallback, timestamps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers.models.whisper.modeling_whisper import WhisperDecoder, WhisperDecoderLayer

from engine.recognizer import Interrupted
from engine.whisper.decoder_step import DecoderStep, KVCache
from engine.whisper.keyterms import Boost
from engine.whisper.step_graphs import EagerSteps, StepGraphs
from engine.whisper.vocabulary import Choice, VocabularyHead

LOOKAHEAD = 4  # draft tokens a row's own token is looked for in, to find its way back


@dataclass(frozen=True, slots=True)
class Greedy:
    """A batch's decoding: `tokens` and `logprobs` are (batch, steps) on the CPU.

    After a row ends (its <|endoftext|>, or its budget used up) its later tokens are the
    end token, as `generate()` pads them; their log-probabilities mean nothing.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor


class Started:
    """A batch after <|startoftranscript|>: `logits` (batch, vocabulary) in float32 there,
    and the cache `GreedyDecoder.decode` continues from (once). `cross` are its
    cross-attention keys and values per layer (word timings reuse them)."""

    def __init__(self, logits: torch.Tensor, cache: KVCache) -> None:
        self.logits = logits
        self.cross = cache.cross
        self._cache: KVCache | None = cache

    def take_cache(self) -> KVCache:
        cache, self._cache = self._cache, None
        if cache is None:
            raise RuntimeError("this batch was decoded already")
        return cache


class GreedyDecoder:
    """Greedy decoding through a `WhisperDecoder` and its output projection (`head`: every
    logit, or an int8 shortlist rescored in float32, `engine.whisper.vocabulary`). `layers`, if
    given, run in place of the decoder's own (copies of them, e.g. in int8, sharing its
    embeddings and final layer norm). With `graphs`, the steps after the prompt and drafts
    replay CUDA graphs on a GPU (`engine.whisper.step_graphs`; elsewhere the same fixed shapes,
    eagerly)."""

    def __init__(
        self,
        decoder: WhisperDecoder,
        head: VocabularyHead,
        *,
        layers: Sequence[WhisperDecoderLayer] | None = None,
        start_token: int,
        end_token: int,
        suppress_tokens: list[int],
        begin_suppress_tokens: list[int],
        graphs: bool = False,
    ) -> None:
        self._decoder = DecoderStep(decoder, head, layers)
        on_gpu = self._decoder.device.type == "cuda"
        self._graphs = StepGraphs(self._decoder, end_token, capture=on_gpu) if graphs else None
        self._max_positions = self._decoder.max_positions
        self._start = start_token
        self._end = end_token
        device = self._decoder.device
        self._suppress = torch.tensor(suppress_tokens, dtype=torch.long, device=device)
        # At the first generated position the begin-suppressed tokens are excluded too.
        self._first_suppress = torch.tensor(
            [*begin_suppress_tokens, *suppress_tokens], dtype=torch.long, device=device
        )

    @property
    def step(self) -> DecoderStep:
        """The decoder's one step (layers, head, caches) this decoding drives."""
        return self._decoder

    @property
    def graphs(self) -> StepGraphs | None:
        """The captured step graphs (None: eager steps)."""
        return self._graphs

    @property
    def max_positions(self) -> int:
        return self._max_positions

    @property
    def vocabulary(self) -> int:
        """How many logits a row has (the size a `Boost` is built for)."""
        return self._decoder.vocabulary

    def start(
        self,
        hidden: torch.Tensor,
        positions: int | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> Started:
        """The decoder at <|startoftranscript|> over encoder states `hidden`, with a cache of
        `positions` tokens (default: the decoder's maximum; the prefix, <|startoftranscript|>,
        the prompt and every token to decode must fit).

        `prefixes[i]`, if given, is what row i reads before <|startoftranscript|>
        (<|startofprev|> and the previous text's tokens), of any length, empty for none.
        Each row's tokens sit at its own positions from 0; a shorter row is padded after
        its <|startoftranscript|>, and what follows overwrites the padding, which its
        attention never sees: a row's result does not depend on its batch-mates' prefixes.
        """
        positions = self._max_positions if positions is None else positions
        batch = hidden.shape[0]
        rows = [[*prefix, self._start] for prefix in (prefixes or [()] * batch)]
        if len(rows) != batch:
            raise ValueError("one prefix (maybe empty) per row")
        width = max(len(row) for row in rows)
        if not width + 1 <= positions <= self._max_positions:
            raise ValueError(
                f"positions must be in [{width + 1}, {self._max_positions}], got {positions}"
            )
        cache = self._decoder.cache(hidden, positions)
        padded = [row + [self._end] * (width - len(row)) for row in rows]
        ids = torch.tensor(padded, dtype=torch.long, device=hidden.device)
        states = self._decoder.feed(cache, ids)
        cache.lengths = torch.tensor([len(row) for row in rows], device=hidden.device)
        last = states[torch.arange(batch, device=hidden.device), cache.lengths - 1]
        return Started(self._decoder.logits(last), cache)

    def decode(
        self,
        started: Started,
        prompts: torch.Tensor,
        budgets: list[int],
        drafts: list[list[int]] | None = None,
        should_stop: Callable[[], bool] | None = None,
        prompt_lengths: Sequence[int] | None = None,
        boost: Boost | None = None,
    ) -> Greedy:
        """Greedy tokens after the prompt (batch, n) that follows <|startoftranscript|>;
        row i decodes at most `budgets[i]` tokens.

        `prompt_lengths[i]`, if given, is how many of row i's prompt tokens are its own
        (rows of different lengths, padded at the end: a forced text prefix, say); row i
        decodes on from its last one. Default: all n.

        `drafts[i]`, if given, is a guess at row i's first tokens (the text of an earlier,
        shorter transcription of the same utterance). All drafts are checked in one decoder
        pass: row i keeps the longest prefix of its draft that greedy decoding would have
        produced anyway and decodes on from there, one token per step, checking the rest of
        its draft again where it finds its way back to it (`_Rejoin`). In float32 the
        result is greedy decoding's whatever the drafts hold (see the module doc for
        int8); a good draft saves most of the steps.

        `should_stop`, if given, is called before every decoder pass; when it returns True
        the decoding ends with `Interrupted` (the scheduler stops a batch that way).

        `boost`, if given, biases each row's choices toward its keyterms.
        """
        cache = started.take_cache()
        batch = prompts.shape[0]
        if batch != cache.keys.shape[1]:
            raise ValueError("one prompt per row")
        room = cache.keys.shape[3] - int(cache.lengths.max()) - prompts.shape[1]
        budgets, guesses = self._plan(batch, room, budgets, drafts)
        _check(should_stop)
        states = self._feed(cache, prompts, prompt_lengths)
        first = self._decoder.choose(states, self._first_suppress, _bias(boost, states))
        if any(guesses):
            _check(should_stop)
            base = cache.lengths.clone()
            width = max(len(guess) for guess in guesses)
            padded = [guess + [self._end] * (width - len(guess)) for guess in guesses]
            fed = self._decoder.feed(
                cache, torch.tensor(padded, dtype=torch.long, device=prompts.device)
            )
            tokens, logprobs, agreed = self._keep(
                first, [fed[i, : len(guess)] for i, guess in enumerate(guesses)], guesses, boost
            )
            for i, row in enumerate(tokens):
                cache.lengths[i] = base[i] + len(row) - 1
        else:
            tokens = [[t] for t in first.tokens.tolist()]
            logprobs = [[p] for p in first.logprobs.tolist()]
            agreed = [0] * batch
        rejoin = _Rejoin(guesses, agreed) if any(guesses) else None
        return self._steps(cache, tokens, logprobs, budgets, should_stop, boost, rejoin)

    def start_and_decode(
        self,
        hidden: torch.Tensor,
        positions: int | None,
        prefixes: Sequence[Sequence[int]] | None,
        prompts: Sequence[Sequence[int]],
        budgets: list[int],
        drafts: list[list[int]] | None = None,
        should_stop: Callable[[], bool] | None = None,
        boost: Boost | None = None,
    ) -> tuple[Started, Greedy]:
        """`start` then `decode`, for rows whose whole prompt is known before the logits at
        <|startoftranscript|> are read (an English-only model, a pinned language): each
        row's prefix, <|startoftranscript|>, prompt (`prompts[i]`, its own length) and
        draft go through the decoder in one pass, not three. The same tokens; the
        returned `Started` holds the logits at <|startoftranscript|> and the cross
        keys/values (its cache is spent)."""
        positions = self._max_positions if positions is None else positions
        batch = hidden.shape[0]
        heads = [[*prefix, self._start] for prefix in (prefixes or [()] * batch)]
        if len(heads) != batch or len(prompts) != batch or min(map(len, prompts)) < 1:
            raise ValueError("one prefix (maybe empty) and one prompt of 1+ tokens per row")
        lead = [len(head) + len(prompt) for head, prompt in zip(heads, prompts, strict=True)]
        budgets, guesses = self._plan(batch, positions - max(lead), budgets, drafts)
        rows = [
            [*head, *prompt, *guesses[i]]
            for i, (head, prompt) in enumerate(zip(heads, prompts, strict=True))
        ]
        width = max(map(len, rows))
        if not width + 1 <= positions <= self._max_positions:
            raise ValueError(
                f"positions must be in [{width + 1}, {self._max_positions}], got {positions}"
            )
        _check(should_stop)
        cache = self._decoder.cache(hidden, positions)
        padded = [row + [self._end] * (width - len(row)) for row in rows]
        states = self._decoder.feed(
            cache, torch.tensor(padded, dtype=torch.long, device=hidden.device)
        )
        at = torch.arange(batch, device=hidden.device)
        sot = torch.tensor([len(head) - 1 for head in heads], device=hidden.device)
        last = torch.tensor([n - 1 for n in lead], device=hidden.device)
        started = Started(self._decoder.logits(states[at, sot]), cache)
        cache = started.take_cache()
        ends = states[at, last]
        first = self._decoder.choose(ends, self._first_suppress, _bias(boost, ends))
        fed = [states[i, lead[i] : lead[i] + len(guess)] for i, guess in enumerate(guesses)]
        tokens, logprobs, agreed = self._keep(first, fed, guesses, boost)
        # Each row's cache ends before its last kept token, which the next step feeds.
        cache.lengths = torch.tensor(
            [lead[i] + len(row) - 1 for i, row in enumerate(tokens)], device=hidden.device
        )
        rejoin = _Rejoin(guesses, agreed) if any(guesses) else None
        return started, self._steps(cache, tokens, logprobs, budgets, should_stop, boost, rejoin)

    def _plan(
        self, batch: int, room: int, budgets: list[int], drafts: list[list[int]] | None
    ) -> tuple[list[int], list[list[int]]]:
        """Each row's budget, cut to the `room` the cache has left after the longest
        prompt, and its draft's usable tokens (a draft token may only be kept where the
        next would still fit the budget; special tokens are never guessed)."""
        if len(budgets) != batch or min(budgets, default=0) < 1:
            raise ValueError("one budget of at least 1 token per row")
        if drafts is not None and len(drafts) != batch:
            raise ValueError("one draft (maybe empty) per row")
        # Every row's tokens must fit, even padded to the longest prefix (a draft check).
        budgets = [min(budget, room) for budget in budgets]
        if min(budgets) < 1:
            raise ValueError("the prompt leaves no room to decode")
        guesses = [
            [t for t in (drafts[i] if drafts else [])[: budgets[i] - 1] if t < self._end]
            for i in range(batch)
        ]
        return budgets, guesses

    def _steps(
        self,
        cache: KVCache,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        budgets: list[int],
        should_stop: Callable[[], bool] | None,
        boost: Boost | None = None,
        rejoin: _Rejoin | None = None,
    ) -> Greedy:
        """One greedy token per unfinished row per step, from each row's tokens so far
        (the last of which the cache does not hold yet), until every row has its end
        token or has used its budget. With `rejoin` (the rows' drafts), a step in which a
        row has found its way back to its draft checks the rest of that draft too
        (`_check_drafts`); not under keyterms nor in step graphs, which take one token."""
        done = [self._finished(row, budgets[i]) for i, row in enumerate(tokens)]
        device = cache.lengths.device
        if boost is not None:
            for i, row in enumerate(tokens):
                boost.advance(i, row)
        graphs = None if all(done) else self._graphs
        steps = graphs.load(cache) if graphs is not None else EagerSteps(self._decoder, cache)
        if graphs is not None or boost is not None:
            rejoin = None
        while not all(done):
            _check(should_stop)
            if rejoin is not None:
                room = cache.keys.shape[3] - int(cache.lengths.max())
                guesses = rejoin.guesses(tokens, done, budgets, room)
                if any(guesses):
                    rejoin.checked(self._check_drafts(cache, tokens, logprobs, guesses, done))
                    done = [
                        done[i] or self._finished(row, budgets[i]) for i, row in enumerate(tokens)
                    ]
                    continue
            pending = [self._end if done[i] else row[-1] for i, row in enumerate(tokens)]
            ids = torch.tensor(pending, dtype=torch.long, device=device)[:, None]
            before = steps.lengths.clone()
            fed = steps.feed(ids)
            choice = self._decoder.choose(fed, self._suppress, _bias(boost, fed))
            # A finished row stays where it is (it only rewrites its next, unused slot), so
            # rows that finished far ahead, on a long draft, cannot outgrow the cache.
            finished = torch.tensor(done, device=device)
            steps.lengths.copy_(torch.where(finished, before, steps.lengths))
            for i, (token, logprob) in enumerate(
                zip(choice.tokens.tolist(), choice.logprobs.tolist(), strict=True)
            ):
                if not done[i]:
                    tokens[i].append(token)
                    logprobs[i].append(logprob)
                    if boost is not None:
                        boost.advance(i, [token])
                    done[i] = self._finished(tokens[i], budgets[i])
            if rejoin is not None:
                rejoin.stepped()
        width = max(len(row) for row in tokens)
        return Greedy(
            torch.tensor([row + [self._end] * (width - len(row)) for row in tokens]),
            torch.tensor([row + [0.0] * (width - len(row)) for row in logprobs]),
        )

    def _finished(self, row: list[int], budget: int) -> bool:
        """A row that has its end token or has used its budget."""
        return row[-1] == self._end or len(row) >= budget

    def _check_drafts(
        self,
        cache: KVCache,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        guesses: list[list[int]],
        done: list[bool],
    ) -> list[int]:
        """A step that checks drafts: each unfinished row feeds its last token and its
        `guesses[i]` (the rest of its draft, maybe none) in one pass, and keeps, as after
        the first pass (`_keep`), the guesses greedy decoding would pick anyway and the
        choice after them; the cache then ends before that choice. Returns how many
        guesses each row kept."""
        before = cache.lengths.clone()
        fed_rows = [
            [self._end if done[i] else row[-1], *guesses[i]] for i, row in enumerate(tokens)
        ]
        width = max(map(len, fed_rows))
        padded = [row + [self._end] * (width - len(row)) for row in fed_rows]
        device = cache.lengths.device
        states = self._decoder.feed(cache, torch.tensor(padded, dtype=torch.long, device=device))
        at = [(i, k) for i, row in enumerate(fed_rows) if not done[i] for k in range(len(row))]
        rows_at = torch.tensor([i for i, _ in at], dtype=torch.long, device=device)
        cols_at = torch.tensor([k for _, k in at], dtype=torch.long, device=device)
        choice = self._decoder.choose(states[rows_at, cols_at], self._suppress)
        picks, probabilities = choice.tokens.tolist(), choice.logprobs.tolist()
        lengths = before.clone()
        kept_counts, offset = [], 0
        for i, guess in enumerate(guesses):
            if done[i]:
                kept_counts.append(0)
                continue
            picked = picks[offset : offset + len(guess) + 1]
            chosen = probabilities[offset : offset + len(guess) + 1]
            offset += len(guess) + 1
            kept = _agreeing(picked, guess)
            # The kept guesses and the choice after them (the cache ends before it).
            tokens[i].extend(picked[: kept + 1])
            logprobs[i].extend(chosen[: kept + 1])
            lengths[i] = before[i] + kept + 1
            kept_counts.append(kept)
        cache.lengths.copy_(lengths)
        return kept_counts

    def _feed(
        self, cache: KVCache, prompts: torch.Tensor, lengths: Sequence[int] | None
    ) -> torch.Tensor:
        """Decoder states (batch, d_model) at each row's last prompt token; the cache then
        ends there (a row's padding is overwritten by what it decodes next, unseen)."""
        base = cache.lengths.clone()
        states = self._decoder.feed(cache, prompts)
        if lengths is None:
            return states[:, -1]
        own = torch.tensor(list(lengths), dtype=torch.long, device=prompts.device)
        if own.shape[0] != prompts.shape[0] or not bool(
            ((own >= 1) & (own <= prompts.shape[1])).all()
        ):
            raise ValueError("one prompt length in [1, prompt width] per row")
        cache.lengths = base + own
        return states[torch.arange(prompts.shape[0], device=prompts.device), own - 1]

    def _keep(
        self,
        first: Choice,
        fed: Sequence[torch.Tensor],
        drafts: list[list[int]],
        boost: Boost | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Each row's agreeing draft prefix (at least the first token, which the prompt's
        logits pick). `first` is the choice at the first generated position; `fed[i]`
        the decoder states at row i's draft tokens, fed after its prompt. Returns each
        row's tokens and log-probabilities, and how many of its draft's tokens it kept."""
        tokens: list[list[int]] = []
        logprobs: list[list[float]] = []
        agreed: list[int] = []
        for i, draft in enumerate(drafts):
            if not draft:
                tokens.append(first.tokens[i : i + 1].tolist())
                logprobs.append(first.logprobs[i : i + 1].tolist())
                agreed.append(0)
                continue
            # Position k's logits pick token k: the first from the prompt, then one per
            # draft token fed.
            # With keyterms, position k's bias is the row's after the draft's first k tokens.
            bias = None if boost is None else boost.along(i, draft, fed[i].device)[1:]
            later = self._decoder.choose(fed[i], self._suppress, bias)
            picked = torch.cat([first.tokens[i : i + 1], later.tokens]).tolist()
            chosen = torch.cat([first.logprobs[i : i + 1], later.logprobs]).tolist()
            kept = _agreeing(picked, draft)
            # The kept prefix and the choice after it, which this pass made as a single
            # step would, up to rounding (the module doc: with int8 layers activations are
            # quantized per row for that; per-call scales once tipped a near tie, and a
            # sentence was said twice).
            tokens.append(picked[: kept + 1])
            logprobs.append(chosen[: kept + 1])
            agreed.append(kept)
        return tokens, logprobs, agreed


class _Rejoin:
    """Where each row of a batch stands in its draft once decoding has left it: a row
    whose draft went wrong at one token (a comma, a capital, a word) mostly goes on as the
    draft does after it. Each token a row chooses itself (not a draft token it kept) is
    looked for in the next `LOOKAHEAD` tokens of its draft; where found, the draft after
    it is the row's next guess (`GreedyDecoder._check_drafts`). Every pass ends on a token
    of the row's own choosing (the one after its kept guesses); each is looked for once,
    and a draft token is used once."""

    def __init__(self, drafts: list[list[int]], agreed: list[int]) -> None:
        self._drafts = drafts
        self._cursor = list(agreed)  # each row's first draft token not yet used
        self._own = [True] * len(drafts)  # the row's last token is still to be looked for

    def guesses(
        self, tokens: list[list[int]], done: list[bool], budgets: list[int], room: int
    ) -> list[list[int]]:
        """Each row's next guess (maybe none): the draft after its last token, where the
        row found its way back there, within its budget and the cache's `room`."""
        guesses: list[list[int]] = []
        for i, draft in enumerate(self._drafts):
            guess: list[int] = []
            if self._own[i] and not done[i]:
                self._own[i] = False
                start = self._cursor[i]
                window = draft[start : start + LOOKAHEAD]
                if tokens[i][-1] in window:
                    at = start + window.index(tokens[i][-1]) + 1
                    self._cursor[i] = at
                    limit = min(budgets[i] - len(tokens[i]) - 1, room - 1)
                    guess = draft[at : at + max(0, limit)]
            guesses.append(guess)
        return guesses

    def checked(self, kept: list[int]) -> None:
        """After `GreedyDecoder._check_drafts`: the guesses each row kept."""
        for i, count in enumerate(kept):
            self._cursor[i] += count
        self.stepped()

    def stepped(self) -> None:
        """After a pass: every row's last token is its own choice."""
        self._own = [True] * len(self._drafts)


def _agreeing(picked: Sequence[int], draft: Sequence[int]) -> int:
    """How many of `draft`'s tokens, from its first, the pass picked (`picked[k]`: its
    choice at the position where draft token k stands) as greedy decoding would."""
    kept = 0
    while kept < len(draft) and picked[kept] == draft[kept]:
        kept += 1
    return kept


def _bias(boost: Boost | None, states: torch.Tensor) -> torch.Tensor | None:
    return None if boost is None else boost.bias(states.device)


def _check(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise Interrupted("the batch was stopped")
