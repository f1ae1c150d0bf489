"""Scenes of the world: free text -> scene attributes -> conditioning vector, and random
scenes for training.

The world's seed fixes the place (terrain, roads, villages, tree sites, animals); a scene
fixes how it looks, and the default model is conditioned on one. Serving parses prompts
here (numpy only: no renderer is imported); the world renders scenes and training samples
them here. Five attributes, each a closed set of values (first = default):

    biome       grassland | desert | snow | tropical     ground, water, tree and roof palettes
    vegetation  moderate | sparse | dense                how many of the seed's tree sites grow
    time        day | dusk | night                       light tint and brightness, lamps at night
    weather     clear | cloudy | rain | fog | snowfall   cloud shadows, rain streaks, fog, snow
    season      summer | spring | autumn                 grass, crop, flower and leaf colours

``SceneAttrs.to_vector()`` is the conditioning vector: one one-hot block per attribute,
in the order above, values in the order above (``SCENE_DIM`` = 18).

Prompts. ``parse_prompt`` lower-cases the text, splits it into words (runs of letters)
and looks each word up in ``VOCAB``; a word may set several attributes ("jungle" sets
biome=tropical and vegetation=dense), a later word overrides an earlier one for the same
attribute, unknown words are ignored and unset attributes keep their defaults. So
"a snowy forest at night" is biome=snow, vegetation=dense, time=night, weather=clear,
season=summer. The vocabulary (canonical value names are words too):

    grassland: grassland grass grassy meadow meadows plains prairie pasture farmland
               countryside green fields
    desert:    desert deserts sand sandy dune dunes arid oasis canyon
    snow:      snow snowy winter wintry arctic polar frozen ice icy tundra
    tropical:  tropical tropics island islands beach lagoon palm palms  (+ jungle)
    sparse:    sparse barren bare open treeless;   moderate: moderate
    dense:     dense forest forests forested woods woodland wooded lush  (+ jungle)
    day:       day daytime daylight morning noon midday afternoon sunny (sunny: also clear)
    dusk:      dusk dawn sunrise sunset evening twilight golden
    night:     night nighttime midnight dark moonlit nocturnal
    clear:     clear fair cloudless
    cloudy:    cloudy clouds cloud overcast grey gray
    rain:      rain rainy raining storm stormy drizzle showers wet
    fog:       fog foggy mist misty haze hazy
    snowfall:  snowfall snowing snowstorm blizzard flurries
    spring:    spring springtime blossom blossoms flowers flowering bloom blooming
    summer:    summer summertime
    autumn:    autumn autumnal fall
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

import numpy as np

__all__ = ["ATTRIBUTES", "SCENE_DIM", "VOCAB", "SceneAttrs", "parse_prompt", "sample_scene"]

# Attribute name -> its values; the first value is the default. Order is the vector order.
ATTRIBUTES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "biome": ("grassland", "desert", "snow", "tropical"),
        "vegetation": ("moderate", "sparse", "dense"),
        "time": ("day", "dusk", "night"),
        "weather": ("clear", "cloudy", "rain", "fog", "snowfall"),
        "season": ("summer", "spring", "autumn"),
    }
)
SCENE_DIM = sum(len(values) for values in ATTRIBUTES.values())

_SYNONYMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "grassland": (
            "grass",
            "grassy",
            "meadow",
            "meadows",
            "plains",
            "prairie",
            "pasture",
            "farmland",
            "countryside",
            "green",
            "fields",
        ),
        "desert": ("deserts", "sand", "sandy", "dune", "dunes", "arid", "oasis", "canyon"),
        "snow": ("snowy", "winter", "wintry", "arctic", "polar", "frozen", "ice", "icy", "tundra"),
        "tropical": ("tropics", "island", "islands", "beach", "lagoon", "palm", "palms"),
        "sparse": ("barren", "bare", "open", "treeless"),
        "dense": ("forest", "forests", "forested", "woods", "woodland", "wooded", "lush"),
        "day": ("daytime", "daylight", "morning", "noon", "midday", "afternoon"),
        "dusk": ("dawn", "sunrise", "sunset", "evening", "twilight", "golden"),
        "night": ("nighttime", "midnight", "dark", "moonlit", "nocturnal"),
        "clear": ("fair", "cloudless"),
        "cloudy": ("clouds", "cloud", "overcast", "grey", "gray"),
        "rain": ("rainy", "raining", "storm", "stormy", "drizzle", "showers", "wet"),
        "fog": ("foggy", "mist", "misty", "haze", "hazy"),
        "snowfall": ("snowing", "snowstorm", "blizzard", "flurries"),
        "spring": (
            "springtime",
            "blossom",
            "blossoms",
            "flowers",
            "flowering",
            "bloom",
            "blooming",
        ),
        "summer": ("summertime",),
        "autumn": ("autumnal", "fall"),
    }
)
_MULTI: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "jungle": {"biome": "tropical", "vegetation": "dense"},
        "sunny": {"time": "day", "weather": "clear"},
    }
)


def _build_vocab() -> Mapping[str, Mapping[str, str]]:
    attr_of = {value: name for name, values in ATTRIBUTES.items() for value in values}
    vocab: dict[str, Mapping[str, str]] = {}
    for value, name in attr_of.items():
        for word in (value, *_SYNONYMS.get(value, ())):
            vocab[word] = MappingProxyType({name: value})
    for word, setting in _MULTI.items():
        vocab[word] = MappingProxyType(dict(setting))
    return MappingProxyType(vocab)


# Prompt word -> the attribute values it sets.
VOCAB: Mapping[str, Mapping[str, str]] = _build_vocab()


@dataclass(frozen=True, slots=True)
class SceneAttrs:
    """One scene: a value per attribute (see the module docstring)."""

    biome: str = "grassland"
    vegetation: str = "moderate"
    time: str = "day"
    weather: str = "clear"
    season: str = "summer"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in ATTRIBUTES[f.name]:
                raise ValueError(f"{f.name}={value!r} is not one of {list(ATTRIBUTES[f.name])}")

    def to_vector(self) -> np.ndarray:
        """(SCENE_DIM,) float32: concatenated one-hot blocks in ATTRIBUTES order."""
        vec = np.zeros(SCENE_DIM, dtype=np.float32)
        start = 0
        for name, values in ATTRIBUTES.items():
            vec[start + values.index(getattr(self, name))] = 1.0
            start += len(values)
        return vec

    @classmethod
    def from_vector(cls, vec: np.ndarray) -> SceneAttrs:
        """Inverse of ``to_vector`` (argmax per block)."""
        vec = np.asarray(vec, dtype=np.float32).reshape(-1)
        if vec.shape[0] != SCENE_DIM:
            raise ValueError(f"scene vector has length {vec.shape[0]}, expected {SCENE_DIM}")
        chosen: dict[str, str] = {}
        start = 0
        for name, values in ATTRIBUTES.items():
            chosen[name] = values[int(np.argmax(vec[start : start + len(values)]))]
            start += len(values)
        return cls(**chosen)

    def to_prompt(self) -> str:
        """Canonical prompt that ``parse_prompt`` maps back to these attributes."""
        return " ".join(getattr(self, name) for name in ATTRIBUTES)


def parse_prompt(text: str) -> SceneAttrs:
    """Map a free-text prompt to scene attributes through ``VOCAB``."""
    chosen: dict[str, str] = {}
    for word in re.findall(r"[a-z]+", text.lower()):
        chosen.update(VOCAB.get(word, {}))
    return SceneAttrs(**chosen)


# Sampling weights for training scenes, per attribute value (normalised on use).
_SAMPLE_WEIGHTS: Mapping[str, tuple[float, ...]] = MappingProxyType(
    {
        "biome": (1.0, 1.0, 1.0, 1.0),
        "vegetation": (1.0, 1.0, 1.0),
        "time": (2.0, 1.0, 1.0),
        "weather": (3.0, 1.5, 1.0, 1.0, 1.0),
        "season": (1.0, 1.0, 1.0),
    }
)


def sample_scene(rng: np.random.Generator) -> SceneAttrs:
    """A random scene; clear daytime is the most common, as in ``_SAMPLE_WEIGHTS``."""
    chosen: dict[str, str] = {}
    for name, values in ATTRIBUTES.items():
        w = np.asarray(_SAMPLE_WEIGHTS[name], dtype=np.float64)
        chosen[name] = values[int(rng.choice(len(values), p=w / w.sum()))]
    return SceneAttrs(**chosen)
