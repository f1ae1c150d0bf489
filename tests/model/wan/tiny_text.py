"""A tiny UMT5 text encoder and tokenizer on disk, in the layout ``model/wan/text.py`` loads.

``build_tiny_text_dirs(root)`` writes ``root/text_encoder`` (a random ``UMT5EncoderModel``:
config.json + model.safetensors) and ``root/tokenizer`` (a sentencepiece unigram model trained on
a few sentences, wrapped as ``T5Tokenizer``: pad 0, ``</s>`` 1, unk 2, like UMT5's) and returns
the two paths. End-to-end tests use it to build a whole tiny ``--weights`` directory.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

SENTENCES = [
    "a red fox runs through snowy woods",
    "the camera pans over a quiet lake at dawn",
    "a city street at night with neon lights",
    "waves crash on a rocky shore under grey clouds",
    "a small boat drifts down a green river",
    "sunlight falls through tall pine trees",
]


def build_tiny_tokenizer(out_dir: Path, vocab_size: int = 64):
    """Train a unigram sentencepiece model on ``SENTENCES`` and save it as a T5 tokenizer."""
    import sentencepiece as spm
    from transformers import T5Tokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 4), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_tiny_text_dirs(
    root: Path, *, d_model: int = 32, layers: int = 2, heads: int = 2, seed: int = 0,
) -> tuple[Path, Path]:
    """Write a tiny random UMT5 encoder and its tokenizer under ``root``; return (encoder_dir, tokenizer_dir)."""
    from transformers import UMT5Config, UMT5EncoderModel

    root = Path(root)
    enc_dir, tok_dir = root / "text_encoder", root / "tokenizer"
    tokenizer = build_tiny_tokenizer(tok_dir)
    cfg = UMT5Config(
        vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // heads, d_ff=2 * d_model,
        num_layers=layers, num_heads=heads, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    UMT5EncoderModel(cfg).save_pretrained(enc_dir)
    return enc_dir, tok_dir
