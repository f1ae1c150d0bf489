"""Recording chunk traces in a child process, so the server keeps only what it runs.

``torch.jit.trace`` leaves 40-100 MB of resident memory behind per recording (the graphs it
builds for every submodule, with the Python stack of every node, stay registered for the
life of the process, whether the trace is kept or not: ``bench.trace_freeze`` prints the
growth per shape). A warm-up records one trace per bucket x step count x batch size, so the
server grew by ~1.5 GB for traces it holds in a fraction of that.

``record_in_child`` hands the model (pickled whole: weights, dtypes, configuration) and the
shapes to ``python -m worldserve.model.default.trace_recorder``, which records and freezes
each shape's chunk exactly as ``ChunkGraph`` would and sends them back serialized; the
parent loads them (``torch.jit.load``: a compilation unit of their own, freed with them).
Loaded traces give the in-process ones' frames bit for bit (``tests/model/test_chunk_graph.py``).

Wire format, both ways: one pickle on the pipe. In: ``(model_bytes, dtype_name, shapes)``
with shapes ``[(bucket, steps, batch), ...]``; out: ``[trace_bytes, ...]`` in the same order.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import warnings

import torch

from worldserve.model.default.chunk_graph import ChunkGraph, _Traced, trace_body
from worldserve.model.default.dit import WorldModel

Shape = tuple[int, int, int]  # (bucket, steps, batch)


def record_in_child(model: WorldModel, dtype: torch.dtype, shapes: list[Shape],
                    timeout: float = 600.0) -> list[torch.jit.ScriptModule]:
    """The frozen chunk traces of ``shapes`` for ``model`` on the CPU (buffers in ``dtype``),
    recorded in a child process and loaded here. Raises ``RuntimeError`` with the child's error
    output if it fails."""
    buf = io.BytesIO()
    torch.save(model, buf)
    payload = pickle.dumps((buf.getvalue(), str(dtype).removeprefix("torch."), list(shapes)))
    proc = subprocess.run(
        [sys.executable, "-m", "worldserve.model.default.trace_recorder"],
        input=payload, capture_output=True, timeout=timeout, check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"trace recorder exited with {proc.returncode}: {' | '.join(tail)}")
    blobs = pickle.loads(proc.stdout)
    if len(blobs) != len(shapes):
        raise RuntimeError(f"trace recorder returned {len(blobs)} traces for {len(shapes)} shapes")
    with warnings.catch_warnings():  # deprecated with tracing itself (see ``trace_body``)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated")
        return [torch.jit.load(io.BytesIO(b), map_location="cpu") for b in blobs]


def record(model: WorldModel, dtype: torch.dtype, shapes: list[Shape]) -> list[bytes]:
    """Each shape's chunk recorded, frozen and serialized (the child's side)."""
    out = []
    for bucket, steps, batch in shapes:
        graph = ChunkGraph(model, bucket, steps, batch, dtype, torch.device("cpu"), "eager")
        traced = trace_body(_Traced(graph), graph._buffers())
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
