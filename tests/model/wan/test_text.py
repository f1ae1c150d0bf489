"""The UMT5 prompt encoder at a tiny random size, loaded from local directories."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.model.wan.tiny_text import build_tiny_text_dirs
from worldserve.model.wan.text import PromptEncoder, clean_prompt

TEXT_LEN = 24


@pytest.fixture(scope="module")
def text_dirs(tmp_path_factory):
    return build_tiny_text_dirs(tmp_path_factory.mktemp("text"))


@pytest.fixture
def encoder(text_dirs) -> PromptEncoder:
    enc_dir, tok_dir = text_dirs
    return PromptEncoder.load(enc_dir, tok_dir, text_len=TEXT_LEN, cache_size=2)


class CountingEncoder(torch.nn.Module):
    """Wraps the encoder and counts forward passes."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.calls = 0

    def forward(self, **kw):
        self.calls += 1
        return self.inner(**kw)


def prompt_tokens(encoder: PromptEncoder, text: str) -> int:
    return len(encoder.tokenizer(clean_prompt(text)).input_ids)


def test_embedding_is_text_len_by_dim_with_padding_zero(encoder):
    e = encoder.encode("a red fox")
    n = prompt_tokens(encoder, "a red fox")  # with </s>
    assert e.shape == (TEXT_LEN, 32) and 1 < n < TEXT_LEN
    assert torch.all(e[n:] == 0)
    assert torch.all(e[:n].abs().sum(-1) > 0)


def test_embedding_equals_the_encoder_run_on_the_masked_prompt(encoder):
    text = "waves crash"
    tok = encoder.tokenizer([text], padding="max_length", max_length=TEXT_LEN, return_tensors="pt")
    with torch.no_grad():
        want = encoder.encoder(input_ids=tok.input_ids, attention_mask=tok.attention_mask).last_hidden_state[0]
    n = int(tok.attention_mask.sum())
    torch.testing.assert_close(encoder.encode(text)[:n], want[:n])


def test_long_prompt_is_truncated_to_text_len(encoder):
    e = encoder.encode(" ".join(["sunlight falls through tall pine trees"] * 20))
    assert e.shape == (TEXT_LEN, 32)
    assert torch.all(e.abs().sum(-1) > 0)  # every position holds a token


def test_repeated_prompt_costs_no_encoder_pass(encoder):
    counting = CountingEncoder(encoder.encoder)
    encoder.encoder = counting
    first = encoder.encode("a small boat drifts down a green river")
    again = encoder.encode("a small  boat drifts down a green river ")  # the same after cleaning
    assert again is first
    assert counting.calls == 1 and (encoder.hits, encoder.misses) == (1, 1)


def test_batch_encodes_only_the_new_prompts_in_one_pass(encoder):
    counting = CountingEncoder(encoder.encoder)
    encoder.encoder = counting
    a = encoder.encode("a city street at night")
    batch = encoder.encode_batch(["a city street at night", "a quiet lake", "a quiet lake"])
    assert batch.shape == (3, TEXT_LEN, 32)
    assert torch.equal(batch[0], a) and torch.equal(batch[1], batch[2])
    assert counting.calls == 2 and (encoder.hits, encoder.misses) == (1, 2)


def test_cache_is_bounded_and_evicts_the_least_recently_used(encoder):
    counting = CountingEncoder(encoder.encoder)
    encoder.encoder = counting
    encoder.encode("one")
    encoder.encode("two")
    encoder.encode("one")  # "two" is now the oldest
    encoder.encode("three")
    assert encoder.cached_prompts == 2
    encoder.encode("one")
    assert counting.calls == 3
    encoder.encode("two")
    assert counting.calls == 4


def test_cache_is_keyed_by_model_id(text_dirs):
    enc_dir, tok_dir = text_dirs
    a = PromptEncoder.load(enc_dir, tok_dir, text_len=TEXT_LEN, model_id="a")
    b = PromptEncoder(a.encoder, a.tokenizer, model_id="b", text_len=TEXT_LEN)
    b._cache = a._cache  # one shared store: a prompt of model "a" is no hit for "b"
    a.encode("a red fox")
    b.encode("a red fox")
    assert (b.hits, b.misses) == (0, 1) and a.cached_prompts == 2


@pytest.mark.parametrize(
    ("where", "name"),
    [("text_encoder", "model.safetensors"), ("text_encoder", "config.json"),
     ("tokenizer", "tokenizer.json"), ("tokenizer", "tokenizer_config.json")],
)
def test_missing_file_is_an_error_naming_it(text_dirs, tmp_path, where, name):
    enc_dir, tok_dir = text_dirs
    shutil.copytree(enc_dir, tmp_path / "text_encoder")
    shutil.copytree(tok_dir, tmp_path / "tokenizer")
    (tmp_path / where / name).unlink()
    with pytest.raises(FileNotFoundError, match=name.replace(".", r"\.")):
        PromptEncoder.load(tmp_path / "text_encoder", tmp_path / "tokenizer")


def test_prompt_cleaning_matches_wans():
    assert clean_prompt("  a  red\n\tfox &amp;amp; a  hen ") == "a red fox & a hen"
