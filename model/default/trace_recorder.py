"""Recording chunk traces in a child process, so the server keeps only what it runs.

``torch.jit.trace`` leaves 40-100 MB of resident memory behind per recording (the graphs it
builds for every submodule, with the Python stack of every node, stay registered for the
life of the process, whether the trace is kept or not: ``bench.trace_freeze`` prints the
growth per shape). A warm-up records one trace per bucket x step count x batch size, so the
server grew by ~1.5 GB for traces it holds in a fraction of that.

``record_serialized`` hands the model (pickled whole: weights, dtypes, configuration) and the
shapes to ``python -m worldserve.model.default.trace_recorder``, which records and freezes
each shape's chunk exactly as ``ChunkGraph`` would and sends them back serialized; the
parent loads them (``load_trace``: ``torch.jit.load``, a compilation unit of their own,
freed with them) and may keep the bytes for the next start (``trace_cache``).
Loaded traces give the in-process ones' frames bit for bit (``tests/model/test_chunk_graph.py``).

Wire format, both ways: one pickle on the pipe. In: ``(model_bytes, dtype_name, shapes)``
with shapes ``[(bucket, steps, batch), ...]``; out: ``[trace_bytes, ...]`` in the same order.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack

import torch

from worldserve.model.default.chunk_graph import ChunkGraph, _Traced, trace_body
from worldserve.model.default.net.dit import WorldModel

Shape = tuple[int, int, int]  # (bucket, steps, batch)


def model_bytes(model: WorldModel) -> bytes:
    """The model pickled whole (weights, dtypes, configuration): what a child rebuilds it from."""
    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


def load_trace(data: bytes) -> torch.jit.ScriptModule:
    """A trace serialized by a child (or kept by ``TraceCache``), loaded on the CPU."""
    with warnings.catch_warnings():  # deprecated with tracing itself (see ``trace_body``)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated")
        return torch.jit.load(io.BytesIO(data), map_location="cpu")


def record_in_child(model: WorldModel, dtype: torch.dtype, shapes: list[Shape], *,
                    workers: int | None = None, timeout: float = 600.0) -> list[torch.jit.ScriptModule]:
    """The frozen chunk traces of ``shapes`` for ``model`` on the CPU, recorded in child
    processes and loaded here (``record_serialized``)."""
    return [load_trace(b) for b in record_serialized(model_bytes(model), dtype, shapes, workers=workers,
                                                     timeout=timeout)]


def record_serialized(model: bytes, dtype: torch.dtype, shapes: list[Shape], *,
                      workers: int | None = None, timeout: float = 600.0) -> list[bytes]:
    """The frozen chunk traces of ``shapes`` for the pickled ``model`` (``model_bytes``),
    buffers in ``dtype``, serialized, recorded in child processes (``workers`` of them, the
    CPUs by default, at most 4: each takes every ``workers``-th shape). Raises
    ``RuntimeError`` with a child's error output if one fails."""
    name = str(dtype).removeprefix("torch.")
    n = max(1, min(workers or os.cpu_count() or 1, 4, len(shapes)))
    parts = [list(shapes[i::n]) for i in range(n)]
    with ExitStack() as stack:
        # stderr to files: a chatty child never blocks on a full pipe
        errs = [stack.enter_context(tempfile.TemporaryFile()) for _ in parts]
        procs: list[subprocess.Popen[bytes]] = []
        outs: list[bytes] = []
        try:
            for err, part in zip(errs, parts, strict=True):
                proc = subprocess.Popen([sys.executable, "-m", "worldserve.model.default.trace_recorder"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
                procs.append(proc)
                assert proc.stdin is not None
                proc.stdin.write(pickle.dumps((model, name, part)))
                proc.stdin.close()
                proc.stdin = None  # given whole: communicate() only reads
            deadline = time.monotonic() + timeout
            for proc in procs:  # each child records its shapes meanwhile, then writes them at once
                outs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        for proc, err in zip(procs, errs, strict=True):
            if proc.returncode != 0:
                err.seek(0)
                tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"trace recorder exited with {proc.returncode}: {' | '.join(tail)}")
    blobs: list[bytes] = [b""] * len(shapes)
    for i, out in enumerate(outs):
        got = pickle.loads(out)
        if len(got) != len(parts[i]):
            raise RuntimeError(f"trace recorder returned {len(got)} traces for {len(parts[i])} shapes")
        blobs[i::n] = got
    return blobs


def record(model: WorldModel, dtype: torch.dtype, shapes: list[Shape]) -> list[bytes]:
    """Each shape's chunk recorded, frozen and serialized (the child's side)."""
    out = []
    for bucket, steps, batch in shapes:
        graph = ChunkGraph(model, bucket, steps, batch, dtype, torch.device("cpu"), "eager")
        traced = trace_body(_Traced(graph), graph._buffers(), run=False)  # the loader runs it
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        out.append(buf.getvalue())
    return out


def main() -> None:
    torch.set_num_threads(1)
    model_bytes, dtype, shapes = pickle.loads(sys.stdin.buffer.read())
    model = torch.load(io.BytesIO(model_bytes), weights_only=False, map_location="cpu")
    model.eval()
    blobs = record(model, getattr(torch, dtype), [tuple(s) for s in shapes])
    sys.stdout.buffer.write(pickle.dumps(blobs))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
