"""A whole chunk of a batch as one replayable CUDA graph.

At this model's size a denoising forward is a few hundred small kernels, and on a GPU their
launches, not their arithmetic, set its time (``bench.gpu_check``). A ``ChunkGraph`` runs
every denoising forward, the decode and the commit forward of one chunk from fixed buffers,
so on CUDA the chunk is captured once per (bucket, step count, padded batch) and replayed.

Everything that changes between chunks lives in those buffers: the cached keys/values of
the context, the previous frames, the actions, the scene vectors and each step's noise. The
runner fills them (the cache gather and each session's own noise stay eager), replays, and
copies out what it keeps: the static outputs are overwritten by the next replay. Batches are
padded to a power of two, so a few graphs serve every batch size; pad rows compute on
whatever their buffers last held and are dropped.

One-frame chunks past the sink run here (their own queries and keys take no time rotation):
the steady state, a full cache, and the frames that fill the cache first, whose graphs
(``masked``) also take the mask of the positions that hold a frame. A session's sink frames
take the eager path; with a start frame or an observation that is its anchor alone, so
every frame it generates replays a graph. The two variants of a shape are captured
together, so a session that goes from filling to steady (or a degradation step to another
step count) meets graphs that are already there. On the CPU the same buffers run eagerly
(``capture=False``): that is how the tests hold this path to the eager one.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from worldserve.model.default.dit import ChunkContext, WorldModel
from worldserve.model.rope import Rope


def padded(batch: int) -> int:
    """The graph batch size that serves ``batch`` chunks: the next power of two."""
    return 1 << max(0, batch - 1).bit_length()


class ChunkGraph:
    def __init__(self, model: WorldModel, bucket: int, steps: int, batch: int, dtype: torch.dtype,
                 device: torch.device, capture: bool, masked: bool = False):
        cfg = model.cfg
        self.model, self.steps, self.batch, self.capture = model, steps, batch, capture
        self.levels = cfg.noise_levels(steps)
        fc, c, t = cfg.frames_per_chunk, cfg.channels, cfg.tokens_per_frame(bucket)
        new = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        ctx_shape = (cfg.depth, batch, cfg.kv_cache_tokens(bucket) + fc * t, cfg.heads, cfg.head_dim)
        self.ctx_k, self.ctx_v = new(*ctx_shape), new(*ctx_shape)
        self.prev = new(batch, cfg.prev_channels, bucket, bucket)
        self.actions = new(batch, fc, cfg.action_dim)
        self.scene = new(batch, cfg.scene_dim)
        self.noise = new(steps, batch, fc, c, bucket, bucket)
        # which context positions hold a frame (the chunk's own always do); pad rows see all
        self.mask = torch.ones(batch, 1, 1, ctx_shape[2], dtype=torch.bool, device=device) if masked else None
        none = torch.empty(0, dtype=dtype, device=device)
        self._identity = Rope(none, none, identity=True)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: tuple[torch.Tensor, ...] = ()

    def _body(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pixels uint8 (B, F, H, W, 3), clean (B, F, C, H, W), keys, values (L, B, F*T, H, D))."""
        model, levels = self.model, self.levels
        ctx = ChunkContext(k=self.ctx_k, v=self.ctx_v, mask=self.mask, rope_q=self._identity, rope_k=self._identity)
        fc = self.actions.shape[1]
        prev = self.prev[:, None].expand(-1, fc, -1, -1, -1)
        inp = model.prepare_chunk(prev, self.actions, self.scene, [*levels, 0.0])
        return model.sample_chunk(inp, ctx, lambda i: self.noise[i], self.prev.dtype)

    def capture_now(self) -> None:
        """Capture the graph (CUDA only; after warm-up runs on a side stream, as capture
        requires). Runs on whatever the buffers hold: the next ``run`` replays on its own."""
        if not self.capture or self._graph is not None:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._body()
        self._graph = graph

    def run(self) -> tuple[torch.Tensor, ...]:
        """Run the chunk on what the buffers hold now: eagerly (``capture=False``), else by
        replaying the graph, captured on the first call. A replay's outputs are the graph's
        own buffers until the next one."""
        if not self.capture:
            return self._body()
        self.capture_now()
        assert self._graph is not None
        self._graph.replay()
        return self._out


class ChunkGraphs:
    """The graphs of one runner, least recently used dropped past ``limit``: one per
    (bucket, step count, padded batch, masked)."""

    def __init__(self, model: WorldModel, dtype: torch.dtype, device: torch.device, limit: int = 64):
        self.model, self.dtype, self.device, self.limit = model, dtype, device, limit
        self.capture = device.type == "cuda"
        self._graphs: OrderedDict[tuple[int, int, int, bool], ChunkGraph] = OrderedDict()

    def get(self, bucket: int, steps: int, batch: int, masked: bool = False) -> ChunkGraph:
        """The graph for a chunk of ``batch`` sessions; a new one's sibling (the other
        ``masked``) is made and captured with it."""
        key = (bucket, steps, padded(batch), masked)
        graph = self._graphs.pop(key, None)
        if graph is None:
            graph = self._make(key)
            sibling = (bucket, steps, key[2], not masked)
            if sibling not in self._graphs:
                self._graphs[sibling] = self._make(sibling)
                self._graphs[sibling].capture_now()
        self._graphs[key] = graph
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)
        return graph

    def _make(self, key: tuple[int, int, int, bool]) -> ChunkGraph:
        bucket, steps, batch, masked = key
        return ChunkGraph(self.model, bucket, steps, batch, self.dtype, self.device, self.capture, masked)

    def __len__(self) -> int:
        return len(self._graphs)
