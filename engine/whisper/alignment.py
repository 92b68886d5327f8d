"""Word timings of finals: the decoder's alignment heads and DTW, as Whisper's `find_alignment`.

Some cross-attention heads of Whisper's decoder (the checkpoint's `alignment_heads`, e.g. 8
of tiny.en's 24) look at the audio frame of the token being written. `Aligner.align` runs
the decoder once more over each final's own tokens (teacher-forced, the batch's finals
together, without the prompt of previous text, as Whisper does), through the layers up to
the last one with an alignment head only, reusing the encoder keys and values the greedy
decoder already projected; the fused attention kernels do not return attention weights,
so the alignment heads' weights are computed from their queries and keys here. Then, per
utterance and as Whisper does: a softmax over the utterance's audio frames, each frame
standardised across the tokens, a median filter of 7 frames along time, the heads' mean,
and dynamic time warping through the negated matrix; a token starts at the frame where
the path first reaches its row. Tokens become words as Whisper splits them (on spaces; on
characters for languages written without them); a word's probability is its tokens' mean
probability from the greedy decoding. Whisper's fixes follow: punctuation joins its word,
a long word at a sentence boundary is trimmed to twice the median word length, and so is
the first word when it would start long before the speech (an utterance starts with a
fifth of a second of silence before the voice activity detector's onset). Unlike Whisper,
the path starts on the prompt's rows, which take the silence before the first word.

Times are seconds from the start of the utterance's audio, on a 20 ms grid (the encoder's
frame), inside [0, its duration]. Computed for finals only (`Utterance.word_timings`);
the cost: docs/performance.md#the-models-arithmetic.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional
from transformers.models.whisper.modeling_whisper import WhisperDecoder, WhisperDecoderLayer

from engine.api import SAMPLE_RATE, WordTiming

FRAME_SECONDS = 0.02  # one encoder frame: two 10 ms mel frames
MEDIAN_FILTER_WIDTH = 7
# Whisper's defaults (`transcribe(prepend_punctuations=..., append_punctuations=...)`).
PREPENDED = "\"'“¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"
SENTENCE_ENDS = ".。!！?？"
# Written without spaces between words: split into characters, as Whisper does.
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


@dataclass(frozen=True, slots=True)
class AlignmentRequest:
    """One utterance to align: its batch row, its decoded text tokens (no special tokens)
    and their log-probabilities, the prompt they were decoded after (<|startoftranscript|>
    to <|notimestamps|>), its language and its audio length in samples."""

    row: int
    tokens: list[int]
    logprobs: list[float]
    prompt: list[int]
    language: str
    samples: int


@dataclass(slots=True)
class _Word:
    text: str
    tokens: list[int]
    start: float
    end: float
    probability: float


class Aligner:
    """Word timings for greedy decodings of a `WhisperDecoder`'s batch."""

    def __init__(
        self,
        decoder: WhisperDecoder,
        alignment_heads: Sequence[Sequence[int]],
        token_strings: Sequence[str],
        *,
        end_token: int,
    ) -> None:
        """`alignment_heads`: (layer, head) pairs; `token_strings[i]`: token i as the
        byte-level BPE vocabulary writes it (`convert_ids_to_tokens`)."""
        self._decoder = decoder
        self._layers: list[WhisperDecoderLayer] = list(decoder.layers)  # type: ignore[arg-type]
        heads: dict[int, list[int]] = {}
        for layer, head in alignment_heads:
            if not (0 <= layer < len(self._layers)):
                raise ValueError(f"alignment head in layer {layer}: the decoder has no such layer")
            heads.setdefault(int(layer), []).append(int(head))
        if not heads:
            raise ValueError("no alignment heads")
        self._heads = {layer: sorted(found) for layer, found in sorted(heads.items())}
        self._last_layer = max(self._heads)
        first = self._layers[0].encoder_attn
        self._num_heads = int(first.num_heads)
        self._head_dim = int(first.head_dim)
        self._token_strings = list(token_strings)
        self._end = end_token
        self._bytes = _bytes_of_characters()

    def align(
        self,
        cross: Sequence[tuple[torch.Tensor, torch.Tensor]],
        requests: Sequence[AlignmentRequest],
    ) -> list[tuple[WordTiming, ...]]:
        """Each request's words, in order. `cross[layer]` are the batch's cross-attention
        keys and values, (batch, heads, frames, head_dim), as the greedy decoder made them."""
        todo = [r for r in requests if r.tokens]
        out: dict[int, tuple[WordTiming, ...]] = {}
        if todo:
            scores = self._scores(cross, todo)
            for index, request in enumerate(todo):
                out[id(request)] = self._words(request, scores[index])
        return [out.get(id(r), ()) for r in requests]

    # ------------------------------------------------------------------ the decoder pass

    @torch.inference_mode()
    def _scores(
        self,
        cross: Sequence[tuple[torch.Tensor, torch.Tensor]],
        requests: Sequence[AlignmentRequest],
    ) -> torch.Tensor:
        """The alignment heads' pre-softmax cross-attention scores over each request's
        sequence (prompt, text tokens, <|endoftext|>), padded at the end to the longest:
        (requests, alignment heads, positions, frames), float32 on the CPU."""
        sequences = [[*r.prompt, *r.tokens, self._end] for r in requests]
        length = max(len(s) for s in sequences)
        keys_device = cross[0][0].device
        ids = torch.tensor(
            [s + [self._end] * (length - len(s)) for s in sequences],
            dtype=torch.long,
            device=keys_device,
        )
        rows = torch.tensor([r.row for r in requests], dtype=torch.long, device=keys_device)
        decoder = self._decoder
        x: torch.Tensor = decoder.embed_tokens(ids) + decoder.embed_positions.weight[:length]
        causal = torch.ones(length, length, dtype=torch.bool, device=keys_device).tril()
        collected: list[torch.Tensor] = []
        for index, layer in enumerate(self._layers[: self._last_layer + 1]):
            attention = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            query = self._split(attention.q_proj(h) * attention.scaling)
            keys = self._split(attention.k_proj(h))
            values = self._split(attention.v_proj(h))
            attended = functional.scaled_dot_product_attention(
                query, keys, values, causal, scale=1.0
            )
            x = x + attention.out_proj(self._merge(attended))
            attention = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            query = self._split(attention.q_proj(h) * attention.scaling)
            keys, values = cross[index]
            keys, values = keys[rows], values[rows]
            heads = self._heads.get(index)
            if heads is not None:
                collected.append(query[:, heads] @ keys[:, heads].transpose(-1, -2))
            if index == self._last_layer:
                break
            attended = functional.scaled_dot_product_attention(query, keys, values, scale=1.0)
            x = x + attention.out_proj(self._merge(attended))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        return torch.cat(collected, dim=1).float().cpu()

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        """(batch, n, heads * head_dim) to (batch, heads, n, head_dim)."""
        batch, n, _ = states.shape
        return states.view(batch, n, self._num_heads, self._head_dim).transpose(1, 2)

    def _merge(self, states: torch.Tensor) -> torch.Tensor:
        batch, _, n, _ = states.shape
        return states.transpose(1, 2).reshape(batch, n, self._num_heads * self._head_dim)

    # ------------------------------------------------------------------ per utterance

    def _words(self, request: AlignmentRequest, scores: torch.Tensor) -> tuple[WordTiming, ...]:
        """One request's words from its scores (heads, padded positions, window frames)."""
        duration = request.samples / SAMPLE_RATE
        frames = min(scores.shape[-1], max(1, math.ceil(duration / FRAME_SECONDS)))
        length = len(request.prompt) + len(request.tokens) + 1
        weights = scores[:, :length, :frames].softmax(dim=-1)
        std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
        weights = _median_filter((weights - mean) / std.clamp_min(1e-10), MEDIAN_FILTER_WIDTH)
        # Rows whose query writes text token k (k = 0 .. n-1), then the one writing the end;
        # before them the prompt's earlier rows (<|startoftranscript|>, ...), which take the
        # silence before the speech (Whisper leaves them out and its first word starts at the
        # first frame: on the corpus with 0-0.6 s of silence before the speech, the first
        # word's start was 0.57 s early on average; 0.21 s with them).
        first = len(request.prompt) - 1
        matrix = weights.mean(dim=0)[: first + len(request.tokens) + 1]
        text_indices, time_indices = dtw(-matrix.double().numpy())
        text_indices = text_indices - first  # negative on the prompt's rows
        pieces, piece_tokens = self._split_words(request.tokens, request.language)
        probabilities = np.exp(np.asarray(request.logprobs, dtype=np.float64))
        # The time each token row is first reached; the end token's row ends the last word.
        jumps = np.diff(text_indices, prepend=text_indices[0] - 1).astype(bool)
        jump_times = (time_indices[jumps] * FRAME_SECONDS)[first:]
        boundaries = np.concatenate([[0], np.cumsum([len(t) for t in piece_tokens])])
        words = [
            _Word(
                text,
                tokens,
                float(jump_times[boundaries[i]]),
                float(jump_times[boundaries[i + 1]]),
                float(probabilities[boundaries[i] : boundaries[i + 1]].mean()),
            )
            for i, (text, tokens) in enumerate(zip(pieces, piece_tokens, strict=True))
        ]
        _fix_long_words(words)
        return tuple(
            WordTiming(
                w.text,
                round(min(max(w.start, 0.0), duration), 3),
                round(min(max(w.end, w.start, 0.0), duration), 3),
                round(w.probability, 4),
            )
            for w in words
            if w.text
        )

    def _split_words(self, tokens: list[int], language: str) -> tuple[list[str], list[list[int]]]:
        """The text tokens as words (leading space kept): Whisper's `split_to_word_tokens`."""
        pieces, piece_tokens = self._split_characters(tokens)
        if language in UNSPACED_LANGUAGES:
            return pieces, piece_tokens
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for piece, ids in zip(pieces, piece_tokens, strict=True):
            punctuation = piece.strip() in string.punctuation
            if not words or piece.startswith(" ") or punctuation:
                words.append(piece)
                word_tokens.append(list(ids))
            else:
                words[-1] += piece
                word_tokens[-1].extend(ids)
        return words, word_tokens

    def _split_characters(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Tokens grouped into whole UTF-8 characters (a character may take several)."""
        pieces: list[str] = []
        piece_tokens: list[list[int]] = []
        pending = b""
        ids: list[int] = []
        for token in tokens:
            pending += self._token_bytes(token)
            ids.append(token)
            try:
                text = pending.decode("utf-8")
            except UnicodeDecodeError:
                continue
            pieces.append(text)
            piece_tokens.append(ids)
            pending, ids = b"", []
        if ids:
            pieces.append(pending.decode("utf-8", errors="replace"))
            piece_tokens.append(ids)
        return pieces, piece_tokens

    def _token_bytes(self, token: int) -> bytes:
        return bytes(self._bytes[c] for c in self._token_strings[token])


def _median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """A median filter along the last dimension, reflecting at the edges (Whisper's)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = functional.pad(x[None], (pad, pad, 0, 0), mode="reflect")[0]
    return padded.unfold(-1, width, 1).median(dim=-1).values


def dtw(cost: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The cheapest monotonic path through `cost` (tokens, frames) from (0, 0) to the last
    cell, moving right, down or diagonally: its cells' (token indices, frame indices).

    Whisper's `dtw_cpu`, one token row at a time: within a row, cell j is reached from
    above-or-diagonal at some k <= j and then rightwards, so its total is the prefix sum
    to j plus the running minimum over k of (best entry at k - prefix sum before k)."""
    tokens, frames = cost.shape
    total = np.full((tokens + 1, frames + 1), np.inf)
    total[0, 0] = 0.0
    for i in range(1, tokens + 1):
        entry = np.minimum(total[i - 1, :-1], total[i - 1, 1:])  # from (i-1, j-1) or (i-1, j)
        sums = np.cumsum(cost[i - 1])
        before = np.concatenate([[0.0], sums[:-1]])
        total[i, 1:] = sums + np.minimum.accumulate(entry - before)
    # Back from the last cell, breaking ties as Whisper's trace does.
    cells = total.tolist()
    i, j = tokens, frames
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if i == 0:
            j -= 1
            continue
        if j == 0:
            i -= 1
            continue
        diagonal, up, left = cells[i - 1][j - 1], cells[i - 1][j], cells[i][j - 1]
        if diagonal < up and diagonal < left:
            i, j = i - 1, j - 1
        elif up < diagonal and up < left:
            i -= 1
        else:
            j -= 1
    path.reverse()
    array = np.array(path, dtype=np.int64).reshape(-1, 2)
    return array[:, 0], array[:, 1]


def _fix_long_words(words: list[_Word]) -> None:
    """Whisper's fixes, in place: trim long words at sentence boundaries and a long first
    word, then join punctuation to its word."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = 2 * median
    if len(durations):
        for i in range(1, len(words)):
            if words[i].end - words[i].start > longest:
                if words[i].text in SENTENCE_ENDS:
                    words[i].end = words[i].start + longest
                elif words[i - 1].text in SENTENCE_ENDS:
                    words[i].start = words[i].end - longest
    _merge_punctuation(words)
    spoken = [w for w in words if w.text]
    # The utterance starts in silence (the segmenter's pre-roll): the first word and the
    # second must not start long before the speech does (Whisper's fix after a pause).
    if spoken and spoken[0].end > 4 * median:
        head = spoken[0]
        second_too_long = len(spoken) > 1 and spoken[1].end - head.start > 2 * longest
        if head.end - head.start > longest or second_too_long:
            if len(spoken) > 1 and spoken[1].end - spoken[1].start > longest:
                boundary = max(spoken[1].end / 2, spoken[1].end - longest)
                head.end = spoken[1].start = boundary
            head.start = max(0.0, head.end - longest)


def _merge_punctuation(words: list[_Word]) -> None:
    """Whisper's `merge_punctuations`: opening marks join the next word, closing marks the
    previous one; the emptied entries keep "" as their text."""
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        previous, following = words[i], words[j]
        if previous.text.startswith(" ") and previous.text.strip() in PREPENDED:
            following.text = previous.text + following.text
            following.tokens = previous.tokens + following.tokens
            previous.text, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        previous, following = words[i], words[j]
        if not previous.text.endswith(" ") and following.text in APPENDED:
            previous.text += following.text
            previous.tokens = previous.tokens + following.tokens
            following.text, following.tokens = "", []
        else:
            i = j
        j += 1


@cache
def _bytes_of_characters() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: each vocabulary character's byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    characters = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, characters, strict=True)}
