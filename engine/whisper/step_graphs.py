"""Single-token decoder steps replayed from CUDA graphs (`PARLEY_DECODER_GRAPHS`).

On a GPU a small Whisper's decoder step is bound by kernel launches and Python, not by
arithmetic: tiny.en's costs about the same at any batch up to a few dozen rows
(docs/performance.md#a-gpu-node), its kernels launched one by one. A CUDA graph records a
step's kernels once and replays them with one launch. That needs fixed shapes and fixed
memory: `DecoderStep.feed_one` (attention over the cache's every position, masked; nothing
read back to the host), run over buffers that live as long as the graph: a cache of
`bucket` rows (the batch's rows, padded up to a power of two) and of the decoder's every
position (a batch's cache holds fewer: its prompts and budgets), its lengths and the
step's ids.

`StepGraphs.load(cache)` copies a batch's cache, after its prompts and drafts (decoded
eagerly by `engine.whisper.greedy`), into the buffers of the graph for its bucket, encoder frames
(the window) and dtype, capturing that graph on first use; `Steps.feed(ids)` then runs
one step: the ids into their buffer, one replay. Rows past the batch feed the end token
from position 0, nobody reads them, and they never reach the cache's end (a batch takes
fewer steps than it has positions). Positions past a row's own hold an earlier batch's
keys, masked as `feed_one` masks every position past a row's length.

Without a GPU (`capture=False`) the same buffers run `feed_one` eagerly: what
tests/engine/test_step_graphs.py checks on the CPU (the tokens are eager decoding's). The
most recently used graphs are kept while their buffers fit `max_bytes` (tiny.en at 64
rows and the 30 s window: ~0.8 GB in float16, most of it the cross-attention keys;
large-v3-turbo's ~2.5 GB), the newest always.
Each thread that decodes (a model worker) has graphs of its own: two workers never share
buffers. Not measured yet: no GPU was lent since this was written.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.whisper.decoder_step import DecoderStep, KVCache

Shape = tuple[int, int, torch.dtype]  # (bucket rows, encoder frames, dtype)
GraphKey = tuple[int, Shape]  # (the decoding thread, its shape)


@dataclass(slots=True)
class _Graph:
    cache: KVCache  # `bucket` rows, live as long as the graph
    ids: torch.Tensor  # (bucket, 1): the token each row feeds
    # The graph and the states (bucket, 1, d_model) its replay writes; None: run eagerly.
    captured: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None


class EagerSteps:
    """One batch's single-token steps through `DecoderStep.feed` on its own cache."""

    def __init__(self, step: DecoderStep, cache: KVCache) -> None:
        self._step = step
        self._cache = cache

    @property
    def lengths(self) -> torch.Tensor:
        """The rows' cache lengths (write them in place)."""
        return self._cache.lengths

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Decoder states (batch, d_model) for one token per row (`ids` (batch, 1))."""
        return self._step.feed(self._cache, ids)[:, -1]


class Steps:
    """One batch's single-token steps over a graph's buffers (`StepGraphs.load`)."""

    def __init__(self, step: DecoderStep, graph: _Graph, batch: int) -> None:
        self._step = step
        self._graph = graph
        self._batch = batch

    @property
    def lengths(self) -> torch.Tensor:
        """The batch's rows' cache lengths: a view of the buffer (write it in place)."""
        return self._graph.cache.lengths[: self._batch]

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Decoder states (batch, d_model) for one token per row (`ids` (batch, 1))."""
        graph = self._graph
        graph.ids[: self._batch].copy_(ids)
        if graph.captured is None:
            states = self._step.feed_one(graph.cache, graph.ids)
        else:
            cuda_graph, states = graph.captured
            cuda_graph.replay()
        return states[: self._batch, -1]


class StepGraphs:
    """The captured steps of one `DecoderStep`, by batch shape (see the module doc)."""

    def __init__(
        self,
        step: DecoderStep,
        end_token: int,
        *,
        capture: bool = True,
        max_bytes: int = 4 * 2**30,
    ) -> None:
        self._step = step
        self._end = end_token
        self._capture = capture
        self._max_bytes = max_bytes
        self._graphs: OrderedDict[GraphKey, _Graph] = OrderedDict()
        self._lock = threading.Lock()  # over `_graphs`, not over the buffers (one thread's)

    @property
    def shapes(self) -> list[Shape]:
        """The shapes held (any thread's), least recently used first."""
        with self._lock:
            return [shape for _, shape in self._graphs]

    def load(self, cache: KVCache) -> Steps:
        """The steps for `cache`'s batch over a graph's buffers, `cache` copied into them
        (captured first if no graph of its shape is held)."""
        _, batch, _, positions, _ = cache.keys.shape
        frames = cache.cross[0][0].shape[2]
        shape = (bucket(batch), frames, cache.keys.dtype)
        key = (threading.get_ident(), shape)
        with self._lock:
            graph = self._graphs.pop(key, None) or self._build(shape, cache)
            self._graphs[key] = graph
            while len(self._graphs) > 1 and self._held_bytes() > self._max_bytes:
                self._graphs.popitem(last=False)
        held = graph.cache
        held.keys[:, :batch, :, :positions].copy_(cache.keys)
        held.values[:, :batch, :, :positions].copy_(cache.values)
        for (keys, values), (held_keys, held_values) in zip(cache.cross, held.cross, strict=True):
            held_keys[:batch].copy_(keys)
            held_values[:batch].copy_(values)
        held.lengths.zero_()
        held.lengths[:batch].copy_(cache.lengths)
        graph.ids.fill_(self._end)
        return Steps(self._step, graph, batch)

    def _held_bytes(self) -> int:
        """The bytes of every held graph's buffers (call with the lock held)."""
        return sum(_bytes(graph.cache) for graph in self._graphs.values())

    def _build(self, shape: Shape, like: KVCache) -> _Graph:
        rows = shape[0]
        cross = [
            (keys.new_zeros((rows, *keys.shape[1:])), values.new_zeros((rows, *values.shape[1:])))
            for keys, values in like.cross
        ]
        cache = KVCache(cross, self._step.max_positions, like.keys)
        ids = torch.full((rows, 1), self._end, dtype=torch.long, device=like.keys.device)
        if not self._capture:
            return _Graph(cache, ids, None)
        device = like.keys.device
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up off the capture, as torch's docs ask
            for _ in range(3):
                self._step.feed_one(cache, ids)
        torch.cuda.current_stream(device).wait_stream(side)
        cache.lengths.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            states = self._step.feed_one(cache, ids)
        cache.lengths.zero_()
        return _Graph(cache, ids, (graph, states))


def _bytes(cache: KVCache) -> int:
    tensors = [cache.keys, cache.values, *(t for pair in cache.cross for t in pair)]
    return sum(t.numel() * t.element_size() for t in tensors)


def bucket(rows: int) -> int:
    """The graph size a batch of `rows` runs in: the next power of two."""
    if rows < 1:
        raise ValueError("a batch has at least one row")
    return 1 << (rows - 1).bit_length()
