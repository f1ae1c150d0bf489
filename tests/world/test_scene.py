from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worldserve.world import ATTRIBUTES, SCENE_DIM, VOCAB, SceneAttrs, parse_prompt, sample_scene


def test_prompt_words_set_attributes_and_the_rest_default() -> None:
    assert parse_prompt("a snowy forest at night") == SceneAttrs(
        biome="snow", vegetation="dense", time="night", weather="clear", season="summer"
    )
    assert parse_prompt("Desert dunes at SUNSET, hazy!") == SceneAttrs(
        biome="desert", time="dusk", weather="fog"
    )
    assert parse_prompt("jungle") == SceneAttrs(biome="tropical", vegetation="dense")


def test_unknown_words_are_ignored_and_empty_prompt_is_default() -> None:
    assert parse_prompt("") == SceneAttrs()
    assert parse_prompt("purple elephants dancing quietly") == SceneAttrs()
    assert parse_prompt("xyzzy autumn qwerty") == SceneAttrs(season="autumn")


def test_later_word_overrides_earlier_for_the_same_attribute() -> None:
    assert parse_prompt("day turning to night").time == "night"
    assert parse_prompt("snowy desert").biome == "desert"


def test_vector_is_one_hot_per_attribute_in_stable_order() -> None:
    vec = SceneAttrs().to_vector()
    assert vec.dtype == np.float32 and vec.shape == (SCENE_DIM,)
    assert SCENE_DIM == sum(len(v) for v in ATTRIBUTES.values()) == 18
    # Defaults are the first value of each block.
    starts = np.cumsum([0, *(len(v) for v in ATTRIBUTES.values())])[:-1]
    assert np.flatnonzero(vec).tolist() == starts.tolist()
    night = SceneAttrs(time="night").to_vector()
    assert night[starts[2] + ATTRIBUTES["time"].index("night")] == 1.0


def test_vector_and_prompt_round_trip_for_sampled_scenes() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = sample_scene(rng)
        assert SceneAttrs.from_vector(s.to_vector()) == s
        assert parse_prompt(s.to_prompt()) == s
        assert s.to_vector().sum() == len(ATTRIBUTES)


def test_invalid_attribute_value_is_rejected_with_its_name() -> None:
    with pytest.raises(ValueError, match="biome='lava'"):
        SceneAttrs(biome="lava")


def test_every_vocab_entry_names_valid_values() -> None:
    for word, setting in VOCAB.items():
        assert word.isalpha() and word == word.lower()
        SceneAttrs(**setting)


@given(st.text(max_size=80))
def test_any_text_parses_to_a_valid_scene(text: str) -> None:
    assert parse_prompt(text).to_vector().sum() == len(ATTRIBUTES)
