"""Prompt embeddings for the Wan2.1 family: UMT5's encoder, its tokenizer, an LRU of prompts.

Wan encodes a prompt as its authors do: the text is cleaned (ftfy, HTML entities unescaped
twice, runs of whitespace collapsed), tokenized with ``</s>`` appended, padded or truncated to
``text_len`` tokens (512), run through the encoder with the padding masked, and every position
past the prompt's own tokens is set to zero. The result is one (text_len, dim) tensor per prompt
(dim 4096 for UMT5-XXL), which the transformer projects into its cross-attention keys and values.

A prompt costs one encoder pass the first time it is seen: embeddings are kept in an LRU keyed
by (model id, cleaned text), so a session that returns to an earlier prompt, or many sessions
sharing one, cost nothing more. ``hits`` / ``misses`` / ``encoder_calls`` count for metrics.

Everything loads from local directories (``local_files_only=True``); nothing is fetched:

    text_encoder/  config.json, model.safetensors (or model.safetensors.index.json + shards)
    tokenizer/     tokenizer_config.json, tokenizer.json or spiece.model

(the ``text_encoder/`` and ``tokenizer/`` folders of Wan2.1-T2V-1.3B-Diffusers have this form),
or the authors' own ``models_t5_umt5-xxl-enc-bf16.pth`` with the ``google/umt5-xxl/`` tokenizer of
the Wan2.1-T2V-1.3B download, renamed as it loads (``model/wan/convert.py``).
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch

ENCODER_CONFIG_FILE = "config.json"
ENCODER_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "spiece.model")

_WHITESPACE = re.compile(r"\s+")


def clean_prompt(text: str) -> str:
    """The prompt as Wan's tokenizer sees it: text repaired, entities unescaped, whitespace collapsed."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return _WHITESPACE.sub(" ", text).strip()


def check_text_dirs(encoder_dir: Path | None, tokenizer_dir: Path) -> None:
    """Raise ``FileNotFoundError`` naming the first file the two directories lack (``None``:
    the encoder is a file, checked as it is read)."""
    if encoder_dir is None:
        pass
    elif not encoder_dir.is_dir():
        raise FileNotFoundError(f"text encoder directory {encoder_dir} does not exist")
    elif not (encoder_dir / ENCODER_CONFIG_FILE).is_file():
        raise FileNotFoundError(f"text encoder directory {encoder_dir} has no {ENCODER_CONFIG_FILE}")
    elif not any((encoder_dir / f).is_file() for f in ENCODER_WEIGHT_FILES):
        raise FileNotFoundError(
            f"text encoder directory {encoder_dir} has no {' or '.join(ENCODER_WEIGHT_FILES)}"
        )
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(f"tokenizer directory {tokenizer_dir} does not exist")
    if not (tokenizer_dir / TOKENIZER_CONFIG_FILE).is_file():
        raise FileNotFoundError(f"tokenizer directory {tokenizer_dir} has no {TOKENIZER_CONFIG_FILE}")
    if not any((tokenizer_dir / f).is_file() for f in TOKENIZER_VOCAB_FILES):
        raise FileNotFoundError(
            f"tokenizer directory {tokenizer_dir} has no {' or '.join(TOKENIZER_VOCAB_FILES)}"
        )


class PromptEncoder:
    """UMT5 encoder + tokenizer + an LRU of prompt embeddings, on the executor thread.

    ``encode(text) -> (text_len, dim)`` and ``encode_batch(texts) -> (B, text_len, dim)`` in the
    encoder's dtype on its device. A cached tensor is returned as it is (the same object each time):
    callers must not modify it.
    """

    def __init__(
        self, encoder: torch.nn.Module, tokenizer, *, model_id: str, text_len: int = 512, cache_size: int = 64,
    ) -> None:
        if text_len < 1:
            raise ValueError(f"text_len must be >= 1, got {text_len}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.encoder = encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.text_len = text_len
        self.cache_size = cache_size
        self.dim: int = encoder.config.d_model
        self._cache: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.encoder_calls = 0

    @classmethod
    def load(
        cls, encoder_dir: str | Path, tokenizer_dir: str | Path, *, device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32, text_len: int = 512, cache_size: int = 64, model_id: str | None = None,
    ) -> PromptEncoder:
        """Load ``UMT5EncoderModel`` and its tokenizer from local directories (see the module doc)."""
        from transformers import AutoTokenizer, UMT5EncoderModel

        encoder_dir, tokenizer_dir = Path(encoder_dir), Path(tokenizer_dir)
        if encoder_dir.is_file():  # the authors' models_t5_umt5-xxl-enc-bf16.pth
            from worldserve.model.wan.convert import load_umt5

            check_text_dirs(None, tokenizer_dir)
            encoder = load_umt5(encoder_dir, dtype=dtype)
        else:
            check_text_dirs(encoder_dir, tokenizer_dir)
            # ``dtype`` is read from transformers 4.56 on (pyproject's minimum)
            encoder = UMT5EncoderModel.from_pretrained(encoder_dir, local_files_only=True, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer in {tokenizer_dir} has no pad token")
        if len(tokenizer) > encoder.config.vocab_size:
            raise ValueError(
                f"tokenizer in {tokenizer_dir} has {len(tokenizer)} tokens, more than the encoder's "
                f"vocab_size {encoder.config.vocab_size} in {encoder_dir / ENCODER_CONFIG_FILE}"
            )
        return cls(
            encoder.to(device), tokenizer, model_id=model_id or str(encoder_dir.resolve()),
            text_len=text_len, cache_size=cache_size,
        )

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    @property
    def cached_prompts(self) -> int:
        return len(self._cache)

    def encode(self, text: str) -> torch.Tensor:
        """One prompt's embedding (text_len, dim); zero past the prompt's tokens."""
        return self._lookup([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings (B, text_len, dim) for B prompts; the ones not cached run in one encoder pass."""
        return torch.stack(self._lookup(texts))

    def _lookup(self, texts: Sequence[str]) -> list[torch.Tensor]:
        keys = [(self.model_id, clean_prompt(t)) for t in texts]
        found: dict[tuple[str, str], torch.Tensor] = {}
        for k in keys:
            if k in self._cache:
                self._cache.move_to_end(k)
                found[k] = self._cache[k]
        todo = list(dict.fromkeys(k for k in keys if k not in found))
        self.hits += len(keys) - sum(1 for k in keys if k not in found)
        self.misses += len(todo)
        if todo:
            for k, e in zip(todo, self._run([k[1] for k in todo]), strict=True):
                found[k] = e
                if self.cache_size:
                    self._cache[k] = e
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return [found[k] for k in keys]

    @torch.inference_mode()
    def _run(self, texts: list[str]) -> torch.Tensor:
        """One encoder pass over cleaned texts: (B, text_len, dim), padding positions zero."""
        tok = self.tokenizer(
            texts, padding="max_length", truncation=True, max_length=self.text_len,
            add_special_tokens=True, return_tensors="pt",
        )
        ids = tok.input_ids.to(self.device)  # (B, text_len)
        mask = tok.attention_mask.to(self.device)  # (B, text_len), 1 on the prompt's tokens
        self.encoder_calls += 1
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, text_len, dim)
        return hidden * mask.unsqueeze(-1).to(hidden.dtype)

    def clear(self) -> None:
        """Forget every cached prompt (the counters stay)."""
        self._cache.clear()
