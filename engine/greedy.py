"""Greedy decoding of a batch with a lean decoder step over the model's own layers.

Why not transformers' `generate()`: on CPU a small Whisper's decoder step is a few
milliseconds of arithmetic, and `generate()` plus the decoder's `forward` add about as much
again in Python per step (cache objects, mask construction, logits processors, stopping
criteria), measured at 3-4 ms a step on the 2-core dev machine; an utterance takes 20-40
steps. This module runs the same arithmetic with none of that: the decoder's own
submodules (embeddings, layer norms, projections, whichever kind `engine.int8` left them),
a key/value cache preallocated once per batch, cross-attention keys and values computed
once from the encoder states, and `scaled_dot_product_attention`. Its tokens equal
`generate()`'s (tests/test_greedy.py checks them on corpus speech).

One batch decodes in two calls:

- `start(hidden)`: the decoder at <|startoftranscript|> alone. The `Started` batch it
  returns holds the logits there (where Whisper reads the no-speech probability and
  detects the language) and the batch's cache; the decoder object itself holds no batch.
- `decode(started, prompts, budgets)`: the rest of each row's prompt (language, task,
  <|notimestamps|>: the same length in every row) in one pass, then one token per step,
  greedy, with Whisper's suppressed tokens, until every row has its <|endoftext|> or has
  used its token budget. Returns the tokens and each one's log-probability.

What it does not do: beam search, temperature fallback, timestamps, prompts of previous
text. Whisper's attention uses no padding mask in the decoder (every row's prompt has the
same length) and none on the encoder states (Whisper was trained on zero-padded windows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional
from transformers.models.whisper.modeling_whisper import (
    WhisperAttention,
    WhisperDecoder,
    WhisperDecoderLayer,
)


@dataclass(frozen=True, slots=True)
class Greedy:
    """A batch's decoding: `tokens` and `logprobs` are (batch, steps) on the CPU.

    After a row ends (its <|endoftext|>, or its budget used up) its later tokens are the
    end token, as `generate()` pads them; their log-probabilities mean nothing.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor


class _Cache:
    """Self-attention keys/values per layer, (batch, heads, positions, head_dim), filled
    from the left; cross-attention keys/values per layer, computed once."""

    def __init__(
        self,
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        positions: int,
        like: torch.Tensor,
    ) -> None:
        batch, heads, _, head_dim = cross[0][0].shape
        shape = (len(cross), batch, heads, positions, head_dim)
        self.keys = like.new_empty(shape)
        self.values = like.new_empty(shape)
        self.length = 0
        self.cross = cross


class Started:
    """A batch after <|startoftranscript|>: `logits` (batch, vocabulary) in float32 there,
    and the cache `GreedyDecoder.decode` continues from (once)."""

    def __init__(self, logits: torch.Tensor, cache: _Cache) -> None:
        self.logits = logits
        self._cache: _Cache | None = cache

    def take_cache(self) -> _Cache:
        cache, self._cache = self._cache, None
        if cache is None:
            raise RuntimeError("this batch was decoded already")
        return cache


class GreedyDecoder:
    """Greedy decoding through a `WhisperDecoder` and its output projection."""

    def __init__(
        self,
        decoder: WhisperDecoder,
        projection: torch.nn.Module,
        *,
        start_token: int,
        end_token: int,
        suppress_tokens: list[int],
        begin_suppress_tokens: list[int],
    ) -> None:
        self._decoder = decoder
        self._projection = projection
        self._layers: list[WhisperDecoderLayer] = list(decoder.layers)  # type: ignore[arg-type]
        first: WhisperAttention = self._layers[0].self_attn
        self._heads = int(first.num_heads)
        self._head_dim = int(first.head_dim)
        self._max_positions = int(decoder.embed_positions.weight.shape[0])
        self._start = start_token
        self._end = end_token
        device = decoder.embed_tokens.weight.device
        self._suppress = torch.tensor(suppress_tokens, dtype=torch.long, device=device)
        self._begin_suppress = torch.tensor(begin_suppress_tokens, dtype=torch.long, device=device)

    @property
    def max_positions(self) -> int:
        return self._max_positions

    def start(self, hidden: torch.Tensor) -> Started:
        """The decoder at <|startoftranscript|> over encoder states `hidden`."""
        cross = [
            (
                self._split(layer.encoder_attn.k_proj(hidden)),
                self._split(layer.encoder_attn.v_proj(hidden)),
            )
            for layer in self._layers
        ]
        cache = _Cache(cross, self._max_positions, hidden)
        ids = torch.full((hidden.shape[0], 1), self._start, dtype=torch.long, device=hidden.device)
        return Started(self._logits(self._step(cache, ids)), cache)

    def decode(self, started: Started, prompts: torch.Tensor, budgets: list[int]) -> Greedy:
        """Greedy tokens after the prompt (batch, n) that follows <|startoftranscript|>;
        row i decodes at most `budgets[i]` tokens."""
        cache = started.take_cache()
        batch = prompts.shape[0]
        if batch != cache.keys.shape[1] or len(budgets) != batch or min(budgets) < 1:
            raise ValueError("one prompt and one budget of at least 1 token per row")
        limit = min(max(budgets), self._max_positions - 1 - prompts.shape[1])
        if limit < 1:
            raise ValueError("the prompt leaves no room to decode")
        device = prompts.device
        budget = torch.tensor(budgets, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        logits = self._logits(self._step(cache, prompts))
        logits[:, self._begin_suppress] = -torch.inf
        for step in range(limit):
            logits[:, self._suppress] = -torch.inf
            token = logits.argmax(dim=-1)
            logprob = logits.log_softmax(dim=-1).gather(1, token[:, None])[:, 0]
            token = torch.where(done, self._end, token)
            tokens.append(token)
            logprobs.append(logprob)
            done = done | (token == self._end) | (budget <= step + 1)
            if step + 1 == limit or bool(done.all()):
                break
            logits = self._logits(self._step(cache, token[:, None]))
        return Greedy(torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu())

    def _logits(self, states: torch.Tensor) -> torch.Tensor:
        last = self._decoder.layer_norm(states[:, -1])
        logits: torch.Tensor = self._projection(last)
        return logits.float()

    def _step(self, cache: _Cache, ids: torch.Tensor) -> torch.Tensor:
        """Decoder states (batch, n, d_model) for `ids` (batch, n) after the cached ones."""
        begin, n = cache.length, ids.shape[1]
        if begin + n > self._max_positions:
            raise ValueError("decoding ran past the decoder's positions")
        decoder = self._decoder
        x: torch.Tensor = (
            decoder.embed_tokens(ids) + decoder.embed_positions.weight[begin : begin + n]
        )
        for index, layer in enumerate(self._layers):
            attention = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            cache.keys[index, :, :, begin : begin + n] = self._split(attention.k_proj(h))
            cache.values[index, :, :, begin : begin + n] = self._split(attention.v_proj(h))
            keys = cache.keys[index, :, :, : begin + n]
            values = cache.values[index, :, :, : begin + n]
            # Causal within the new tokens; a single token sees every earlier one anyway.
            mask = None if n == 1 else _causal(n, begin, x.device)
            x = x + attention.out_proj(self._attend(attention, h, keys, values, mask))
            cross = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            keys, values = cache.cross[index]
            x = x + cross.out_proj(self._attend(cross, h, keys, values, None))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        cache.length = begin + n
        return x

    def _attend(
        self,
        attention: WhisperAttention,
        h: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        # Scaled before the product, in Whisper's order (transformers keeps it for accuracy).
        query = self._split(attention.q_proj(h) * attention.scaling)
        out = functional.scaled_dot_product_attention(query, keys, values, mask, scale=1.0)
        batch, _, n, _ = out.shape
        return out.transpose(1, 2).reshape(batch, n, self._heads * self._head_dim)

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        """(batch, n, heads * head_dim) to (batch, heads, n, head_dim)."""
        batch, n, _ = states.shape
        return states.view(batch, n, self._heads, self._head_dim).transpose(1, 2)


def _causal(n: int, begin: int, device: torch.device) -> torch.Tensor:
    """Boolean mask (n, begin + n): new token i sees the cached ones and new ones up to i."""
    allowed = torch.ones(n, begin + n, dtype=torch.bool, device=device)
    mask: torch.Tensor = allowed.tril(diagonal=begin)
    return mask
