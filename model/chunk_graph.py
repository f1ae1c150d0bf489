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

Only the steady state runs here: a full cache (no mask) and one-frame chunks past the sink
(no time rotation of the chunk's own queries and keys). The first frames of a session take
the eager path. On the CPU the same buffers run eagerly (``capture=False``): that is how the
tests hold this path to the eager one.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from model.dit import ChunkContext, WorldModel
from model.rope import Rope


def padded(batch: int) -> int:
    """The graph batch size that serves ``batch`` chunks: the next power of two."""
    return 1 << max(0, batch - 1).bit_length()


class ChunkGraph:
    def __init__(self, model: WorldModel, bucket: int, steps: int, batch: int, dtype: torch.dtype,
                 device: torch.device, capture: bool):
        cfg = model.cfg
        self.model, self.steps, self.batch, self.capture = model, steps, batch, capture
        self.levels = cfg.noise_levels(steps)
        fc, c, t = cfg.frames_per_chunk, cfg.channels, cfg.tokens_per_frame(bucket)
        new = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        ctx_shape = (cfg.depth, batch, cfg.kv_cache_tokens(bucket) + fc * t, cfg.heads, cfg.head_dim)
        self.ctx_k, self.ctx_v = new(*ctx_shape), new(*ctx_shape)
        self.prev = new(batch, c, bucket, bucket)
        self.actions = new(batch, fc, cfg.action_dim)
        self.scene = new(batch, cfg.scene_dim)
        self.noise = new(steps, batch, fc, c, bucket, bucket)
        none = torch.empty(0, dtype=dtype, device=device)
        self._identity = Rope(none, none, identity=True)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: tuple[torch.Tensor, ...] = ()

    def _body(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pixels uint8 (B, F, H, W, 3), clean (B, F, C, H, W), keys, values (L, B, F*T, H, D))."""
        model, levels = self.model, self.levels
        ctx = ChunkContext(k=self.ctx_k, v=self.ctx_v, mask=None, rope_q=self._identity, rope_k=self._identity)
        fc = self.actions.shape[1]
        prev = self.prev[:, None].expand(-1, fc, -1, -1, -1)
        inp = model.prepare_chunk(prev, self.actions, self.scene, [*levels, 0.0])
        return model.sample_chunk(inp, ctx, lambda i: self.noise[i], self.prev.dtype)

    def run(self) -> tuple[torch.Tensor, ...]:
        """Run the chunk on what the buffers hold now. On CUDA the first call captures the
        graph (after warm-up runs on a side stream, as capture requires) and every call
        replays it; the outputs are the graph's own buffers until the next call."""
        if not self.capture:
            return self._body()
        if self._graph is None:
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
        self._graph.replay()
        return self._out


class ChunkGraphs:
    """The graphs of one runner, least recently used dropped past ``limit``."""

    def __init__(self, model: WorldModel, dtype: torch.dtype, device: torch.device, limit: int = 24):
        self.model, self.dtype, self.device, self.limit = model, dtype, device, limit
        self.capture = device.type == "cuda"
        self._graphs: OrderedDict[tuple[int, int, int], ChunkGraph] = OrderedDict()

    def get(self, bucket: int, steps: int, batch: int) -> ChunkGraph:
        key = (bucket, steps, padded(batch))
        graph = self._graphs.pop(key, None)
        if graph is None:
            graph = ChunkGraph(self.model, bucket, steps, key[2], self.dtype, self.device, self.capture)
        self._graphs[key] = graph
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)
        return graph

    def __len__(self) -> int:
        return len(self._graphs)
