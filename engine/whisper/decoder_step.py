"""Whisper's decoder, one pass at a time, over a key/value cache and the model's own layers.

Why not transformers' `generate()`: on CPU a small Whisper's decoder step is a few
milliseconds of arithmetic, and `generate()` plus the decoder's `forward` add about as much
again in Python per step (cache objects, mask construction, logits processors, stopping
criteria); an utterance takes 20-40 steps. `DecoderStep` runs the same arithmetic with none
of that: the decoder's own submodules (embeddings, layer norms, projections, whichever kind
`engine.whisper.int8` left them), a key/value cache preallocated once per batch (`KVCache`),
cross-attention keys and values computed once from the encoder states, and
`scaled_dot_product_attention`.

A pass feeds any number of tokens per row, each row's placed after its own cached tokens:
rows may sit at different positions (after prefixes of different lengths, or drafts kept
to different lengths), so the cache tracks a length per row and attention masks per row,
and a row's states never depend on its batch-mates' tokens. There is no mask on the
encoder states (Whisper was trained on zero-padded windows).

The vocabulary projection and the choice of each token are the `head`'s
(`engine.whisper.vocabulary`). What is decoded, and when to stop, is `engine.whisper.greedy`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional
from transformers.models.whisper.modeling_whisper import (
    WhisperAttention,
    WhisperDecoder,
    WhisperDecoderLayer,
)

from engine.whisper.vocabulary import Choice, VocabularyHead


class KVCache:
    """Self-attention keys/values per layer, (batch, heads, positions, head_dim), each row
    filled from the left to its own `lengths[row]`; cross-attention keys/values per layer,
    computed once."""

    def __init__(
        self,
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        positions: int,
        like: torch.Tensor,
    ) -> None:
        batch, heads, _, head_dim = cross[0][0].shape
        shape = (len(cross), batch, heads, positions, head_dim)
        # Zeroed, not left uninitialised: rows at different lengths mask each other's
        # unwritten slots, and a masked NaN still poisons attention (0 x NaN = NaN).
        self.keys = like.new_zeros(shape)
        self.values = like.new_zeros(shape)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=like.device)
        self.cross = cross


class DecoderStep:
    """Passes of a `WhisperDecoder` over a `KVCache`, and its output projection (`head`:
    every logit, or an int8 shortlist rescored in float32, `engine.whisper.vocabulary`). `layers`,
    if given, run in place of the decoder's own (copies of them, e.g. in int8, sharing its
    embeddings and final layer norm)."""

    def __init__(
        self,
        decoder: WhisperDecoder,
        head: VocabularyHead,
        layers: Sequence[WhisperDecoderLayer] | None = None,
    ) -> None:
        self._decoder = decoder
        self._head = head
        own: list[WhisperDecoderLayer] = list(decoder.layers)  # type: ignore[arg-type]
        self._layers = own if layers is None else list(layers)
        if len(self._layers) != len(own):
            raise ValueError(f"need {len(own)} decoder layers, got {len(self._layers)}")
        first: WhisperAttention = self._layers[0].self_attn
        self._heads = int(first.num_heads)
        self._head_dim = int(first.head_dim)
        self.max_positions = int(decoder.embed_positions.weight.shape[0])
        self.device = decoder.embed_tokens.weight.device

    def cache(self, hidden: torch.Tensor, positions: int) -> KVCache:
        """An empty cache of `positions` tokens per row for encoder states `hidden`, with
        their cross-attention keys and values per layer (computed once per batch)."""
        cross = [
            (
                self._split(layer.encoder_attn.k_proj(hidden)),
                self._split(layer.encoder_attn.v_proj(hidden)),
            )
            for layer in self._layers
        ]
        return KVCache(cross, positions, hidden)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Float32 logits for every token, for decoder states (rows, d_model)."""
        return self._head.logits(self._decoder.layer_norm(states))

    def choose(
        self, states: torch.Tensor, suppress: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Choice:
        """The greedy choice for decoder states (rows, d_model), `suppress` excluded,
        `bias` (rows, vocabulary) added to the logits if given."""
        return self._head.choose(self._decoder.layer_norm(states), suppress, bias)

    @property
    def vocabulary(self) -> int:
        """How many logits the head gives per row."""
        return int(self._decoder.embed_tokens.num_embeddings)

    def feed(self, cache: KVCache, ids: torch.Tensor) -> torch.Tensor:
        """Decoder states (batch, n, d_model) for `ids` (batch, n), each row's placed after
        its own cached tokens; the cache then holds them too."""
        n = ids.shape[1]
        positions = cache.lengths[:, None] + torch.arange(n, device=ids.device)  # (batch, n)
        span = int(cache.lengths.max()) + n
        if span > cache.keys.shape[3]:
            raise ValueError("decoding ran past the cache's positions")
        # Query i of row b sees the keys at positions up to its own; none where all rows
        # are at the same length and one token is new (it sees every key there is).
        uniform = bool((cache.lengths == cache.lengths[0]).all())
        mask = None
        if n > 1 or not uniform:
            mask = _causal(positions, span)
        return self._layers_over(cache, ids, positions, span, mask)

    def feed_one(self, cache: KVCache, ids: torch.Tensor) -> torch.Tensor:
        """`feed` for one token per row (`ids` (batch, 1)), in fixed shapes and with
        nothing read back to the host: attention spans every position of the cache, those
        past a row's own masked, where `feed` slices the span the longest row reaches. The
        same states; a CUDA graph can capture it (`engine.whisper.step_graphs`). No check that the
        cache has room: the caller's budgets keep every row inside it."""
        positions = cache.lengths[:, None]  # (batch, 1)
        span = cache.keys.shape[3]
        return self._layers_over(cache, ids, positions, span, _causal(positions, span))

    def _layers_over(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        positions: torch.Tensor,
        span: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """The decoder's layers over `ids` at `positions` (batch, n), attending to the
        cache's first `span` positions under `mask`; the cache's lengths grow by n."""
        batch, n = ids.shape
        rows = torch.arange(batch, device=ids.device)[:, None]
        decoder = self._decoder
        x: torch.Tensor = decoder.embed_tokens(ids) + decoder.embed_positions.weight[positions]
        for index, layer in enumerate(self._layers):
            attention = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            # (batch, heads, n, head_dim) written at [row, :, its positions]
            cache.keys[index][rows, :, positions] = self._split(attention.k_proj(h)).transpose(1, 2)
            cache.values[index][rows, :, positions] = self._split(attention.v_proj(h)).transpose(
                1, 2
            )
            keys = cache.keys[index, :, :, :span]
            values = cache.values[index, :, :, :span]
            x = x + attention.out_proj(self._attend(attention, h, keys, values, mask))
            cross = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            keys, values = cache.cross[index]
            x = x + cross.out_proj(self._attend(cross, h, keys, values, None))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        cache.lengths += n
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


def _causal(positions: torch.Tensor, span: int) -> torch.Tensor:
    """The attention mask (batch, 1, n, span): query i of row b sees the keys at positions
    up to its own, `positions[b, i]`."""
    keys_at = torch.arange(span, device=positions.device)
    return (keys_at[None, None, :] <= positions[:, :, None])[:, None]
