"""A whole chunk of a batch as one replayable graph: a CUDA graph on a GPU, a TorchScript
trace on the CPU.

At this model's size a denoising forward is a few hundred small kernels, and on a GPU their
launches, not their arithmetic, set its time (``bench.gpu_check``). A ``ChunkGraph`` runs
every denoising forward, the decode and the commit forward of one chunk from fixed buffers,
so on CUDA the chunk is captured once per (bucket, step count, batch size) and replayed.

Everything that changes between chunks lives in those buffers: the cached keys/values of
the context, the previous frames, the actions, the scene vectors and each step's noise. The
runner fills them (the cache gather and each session's own noise stay eager), replays, and
copies out what it keeps: the static outputs are overwritten by the next replay. A batch runs
in the smallest graph of its bucket and step count that holds it (a batch larger than every
graph gets one of its own size), so the sizes warm-up records are the sizes batches run as:
powers of two make a few graphs serve every size, every size up to the largest makes none
pay for rows it does not fill. Pad rows compute on whatever their buffers last held and are
dropped.

One-frame chunks past the sink run here (their own queries and keys take no time rotation):
the steady state, a full cache, and the frames that fill the cache first, whose graphs
(``masked``) also take the mask of the positions that hold a frame. A session's sink frames
take the eager path; with a start frame or an observation that is its anchor alone, so
every frame it generates replays a graph. The two variants of a shape are captured
together, so a session that goes from filling to steady (or a degradation step to another
step count) meets graphs that are already there.

On the CPU the same few hundred small kernels run eagerly from Python, and the thread running
them needs the GIL back after every one: beside a thread that runs Python a quarter of the
time, an eager chunk took 1.5x its time alone (``bench.gil_contention``). ``mode="trace"``
records ``_body`` once per shape with ``torch.jit.trace`` and runs the recording, which
executes in C++ with the GIL released (1.02x there) and is 5-15 % faster alone. The trace
holds the shapes and the Python branches of the shape it was recorded on, which is why there
is one per shape, as for CUDA graphs. Traces are of the steady state only: a batch with a
cache still filling runs eagerly, which halves the shapes a warm-up records (a shape first met
after warm-up is recorded then: about half a second of the model thread). ``mode="eager"`` runs the
same buffers eagerly: that is how the tests hold this path to the eager one.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Literal

import torch
from torch import nn

from worldserve.model.default.net.dit import ChunkContext, WorldModel
from worldserve.model.default.net.rope import Rope

Mode = Literal["capture", "trace", "eager"]  # CUDA graph, TorchScript trace, buffers run eagerly


class _Traced(nn.Module):
    """``ChunkGraph._body`` as a module with its buffers as inputs, for ``torch.jit.trace``:
    the model's weights are its parameters, not constants of the recording."""

    def __init__(self, graph: ChunkGraph):
        super().__init__()
        self.model = graph.model
        self.graph = graph  # not a module: holds no parameters of its own

    def forward(self, *buffers: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.graph._body(*buffers)


class ChunkGraph:
    def __init__(self, model: WorldModel, bucket: int, steps: int, batch: int, dtype: torch.dtype,
                 device: torch.device, mode: Mode, masked: bool = False):
        cfg = model.cfg
        self.model, self.steps, self.batch, self.mode = model, steps, batch, mode
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
        self._trace: torch.jit.ScriptModule | None = None
        self._out: tuple[torch.Tensor, ...] = ()

    def _buffers(self) -> tuple[torch.Tensor, ...]:
        return (self.ctx_k, self.ctx_v, self.prev, self.actions, self.scene, self.noise,
                *(() if self.mask is None else (self.mask,)))

    def _body(self, ctx_k: torch.Tensor, ctx_v: torch.Tensor, prev: torch.Tensor, actions: torch.Tensor,
              scene: torch.Tensor, noise: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The chunk on the given buffers (``_buffers``' order) -> (pixels uint8 (B, F, H, W, 3),
        clean (B, F, C, H, W), keys, values (L, B, F*T, H, D))."""
        model = self.model
        ctx = ChunkContext(k=ctx_k, v=ctx_v, mask=mask, rope_q=self._identity, rope_k=self._identity)
        fc = actions.shape[1]
        inp = model.prepare_chunk(prev[:, None].expand(-1, fc, -1, -1, -1), actions, scene, [*self.levels, 0.0])
        return model.sample_chunk(inp, ctx, lambda i: noise[i], prev.dtype)

    def capture_now(self) -> None:
        """Record the graph: capture it (CUDA; after warm-up runs on a side stream, as capture
        requires) or trace it (``mode="trace"``). Runs on whatever the buffers hold: the next
        ``run`` replays on its own."""
        if self.mode == "trace" and self._trace is None:
            self._trace = trace_body(_Traced(self), self._buffers())
        if self.mode != "capture" or self._graph is not None:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body(*self._buffers())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._body(*self._buffers())
        self._graph = graph

    def run(self) -> tuple[torch.Tensor, ...]:
        """Run the chunk on what the buffers hold now: eagerly, through its trace, or by
        replaying the CUDA graph; trace and graph are recorded on the first call. A replay's
        outputs are the graph's own buffers until the next one."""
        if self.mode == "eager":
            return self._body(*self._buffers())
        self.capture_now()
        if self._trace is not None:
            with torch.jit.optimized_execution(False):
                return tuple(self._trace(*self._buffers()))
        assert self._graph is not None
        self._graph.replay()
        return self._out


class ChunkGraphs:
    """The graphs of one runner, least recently used dropped past ``limit``: one per
    (bucket, step count, graph batch size, masked)."""

    def __init__(self, model: WorldModel, dtype: torch.dtype, device: torch.device, limit: int = 64,
                 trace: bool = False):
        """On CUDA, graphs are captured; on the CPU they are traced with ``trace``, else their
        buffers run eagerly."""
        self.model, self.dtype, self.device, self.limit = model, dtype, device, limit
        self.mode: Mode = "capture" if device.type == "cuda" else "trace" if trace else "eager"
        self._graphs: OrderedDict[tuple[int, int, int, bool], ChunkGraph] = OrderedDict()

    def run_as(self, bucket: int, steps: int, batch: int) -> int:
        """The graph batch size a chunk of ``batch`` sessions runs at: the smallest graph of
        its bucket and step count that holds it, else its own size (a graph made for it)."""
        return min((k[2] for k in self._graphs if k[:2] == (bucket, steps) and k[2] >= batch), default=batch)

    def get(self, bucket: int, steps: int, batch: int, masked: bool = False) -> ChunkGraph:
        """The graph for a chunk of ``batch`` sessions (``run_as``); a new one's sibling (the
        other ``masked``) is made and captured with it."""
        key = (bucket, steps, self.run_as(bucket, steps, batch), masked)
        graph = self._graphs.pop(key, None)
        if graph is None:
            graph = self._make(key)
            sibling = (bucket, steps, key[2], not masked)
            if sibling not in self._graphs and not (self.steady_only and sibling[3]):
                self._graphs[sibling] = self._make(sibling)
                self._graphs[sibling].capture_now()
        self._put(key, graph)
        return graph

    def has_trace(self, bucket: int, steps: int, batch: int) -> bool:
        """Whether a chunk of exactly ``batch`` sessions has its steady-state trace recorded."""
        graph = self._graphs.get((bucket, steps, batch, False))
        return graph is not None and graph._trace is not None

    def adopt(self, bucket: int, steps: int, batch: int, traced: torch.jit.ScriptModule) -> None:
        """Make ``traced`` (recorded elsewhere for exactly this shape, ``trace_recorder``) the
        steady-state trace of a chunk of ``batch`` sessions."""
        assert self.mode == "trace"
        key = (bucket, steps, batch, False)
        graph = self._graphs.pop(key, None) or self._make(key)
        graph._trace = traced
        self._put(key, graph)

    def _put(self, key: tuple[int, int, int, bool], graph: ChunkGraph) -> None:
        """``graph`` as the most recently used, the least recently used dropped past ``limit``."""
        self._graphs[key] = graph
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)

    @property
    def steady_only(self) -> bool:
        """Whether only steady-state shapes are recorded (traces): a batch whose cache is still
        filling runs eagerly instead of through a masked graph."""
        return self.mode == "trace"

    def _make(self, key: tuple[int, int, int, bool]) -> ChunkGraph:
        bucket, steps, batch, masked = key
        return ChunkGraph(self.model, bucket, steps, batch, self.dtype, self.device, self.mode, masked)

    def __len__(self) -> int:
        return len(self._graphs)


def trace_body(body: nn.Module, buffers: tuple[torch.Tensor, ...], freeze: bool = True,
               run: bool = True) -> torch.jit.ScriptModule:
    """``body`` recorded on ``buffers`` by ``torch.jit.trace``, frozen (unless not
    ``freeze``), then run once (the first call of a trace sets it up; not with ``run``
    false, for a trace only serialized). It runs without the graph executor's optimization
    passes: their profiling runs cost ~0.7 s a shape and the optimized chunk was no faster.

    Freezing makes the weights constants of the recording and folds what depends on them
    alone (the slices and transposes of weight matrices, parameter reads): the same
    frames bit for bit, 5-10 % less time a chunk (``bench.trace_freeze``). The weights are
    read when the trace is recorded: weights loaded into the model later need new traces
    (a new runner)."""
    with warnings.catch_warnings():
        # the recording turns shapes into constants (what a per-shape trace means), and
        # torch marks tracing as deprecated in favour of compilers that need a C++ toolchain
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.(trace|freeze).* is deprecated")
        with torch.no_grad():
            traced = torch.jit.trace(body, buffers, check_trace=False)
            if freeze:
                traced = torch.jit.freeze(traced.eval())
    if run:
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            traced(*buffers)
    return traced
