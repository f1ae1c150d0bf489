"""The observation encoder: its stage (resumes, exports, learns the tokenizer's codes) and the
canvas writing a seen frame through it, the ground alone through the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from worldserve.model.default.reference.canvas.ground import GroundPainter
from worldserve.model.default.reference.canvas.observer import (
    load_observer,
    observed_codes,
    observer_from,
    save_observer,
)
from worldserve.model.default.reference.canvas.quilt import GroundBank
from worldserve.model.default.reference.canvas.tokenizer import (
    GroundTokenizer,
    TokenizerConfig,
    load_tokenizer,
    save_tokenizer,
)
from worldserve.training.observer import ObserverTrainConfig, train
from worldserve.world.scene import SceneAttrs

TINY = TokenizerConfig(codes=16, code_dim=4, widths=(8, 8, 8), groups=4)


def _tiny_tokenizer(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    save_tokenizer(GroundTokenizer(TINY), tmp_path / "tok" / "tokenizer")
    return tmp_path / "tok" / "tokenizer"


def test_the_stage_starts_from_the_tokenizer_s_encoder_learns_and_resumes(tmp_path: Path) -> None:
    tok_path = _tiny_tokenizer(tmp_path)
    tc = ObserverTrainConfig(out=tmp_path / "run", steps=3, batch=4, worlds=2, map_size=256, eval_every=1000)
    report = train(tc, resume=False, export=tmp_path / "w" / "observer", tokenizer=tok_path,
                   init=tmp_path / "none")
    assert report["steps"] == 3
    assert {"agree", "agree_base", "psnr", "psnr_base"} <= report["held_out"].keys()
    tok = load_tokenizer(tok_path)
    observer = load_observer(tmp_path / "w" / "observer", tok)
    assert observer is not None
    moved = [k for k, v in observer.state_dict().items() if not torch.equal(v, tok.encoder.state_dict()[k])]
    assert moved, "three steps of Adam moved no weight of the encoder it started from"
    assert train(tc, resume=True, export=None, tokenizer=tok_path)["steps"] == 6
    assert json.loads((tmp_path / "run" / "ckpt.json").read_text())["step"] == 6
    # a new session without the checkpoint starts from the export and its step count
    other = ObserverTrainConfig(**{**tc.__dict__, "out": tmp_path / "elsewhere"})
    assert train(other, resume=True, export=None, tokenizer=tok_path, init=tmp_path / "w" / "observer")["steps"] == 6


def test_an_observer_of_another_codebook_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b = GroundTokenizer(TINY), GroundTokenizer(TINY)
    save_observer(observer_from(a), a, tmp_path / "observer")
    assert load_observer(tmp_path / "observer", a) is not None
    assert load_observer(tmp_path / "observer", b) is None
    assert load_observer(tmp_path / "missing", a) is None


def test_a_seen_frame_is_written_by_the_observer_and_the_ground_alone_by_the_tokenizer() -> None:
    torch.manual_seed(0)
    tok = GroundTokenizer(TINY).eval()
    other = observer_from(tok)
    with torch.no_grad():
        other.out.weight.neg_()  # an observer that picks other codes than the tokenizer
    bank = GroundBank({"grassland/moderate/clear": np.zeros((1, 32, 32), np.uint16)})
    frame = (np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8)
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float() / 127.5 - 1
    assert not torch.equal(observed_codes(tok, other, x), observed_codes(tok, None, x))
    painter = GroundPainter(tok, bank, torch.device("cpu"), ahead=False, observer=other)
    try:
        written = {}
        for seen in (True, False):
            g = painter.start(7, SceneAttrs())
            painter.observe(g, frame, seen=seen)
            written[seen] = g.canvas.crop((float(g.position[0]), float(g.position[1])), 64)
        assert np.array_equal(written[True], observed_codes(tok, other, x)[0].numpy())
        assert np.array_equal(written[False], observed_codes(tok, None, x)[0].numpy())
    finally:
        painter.close()
