"""The study server's compact JSON text is ``json.dumps`` with compact separators, value for value."""

from __future__ import annotations

import json
import math
import random

import pytest

from tuner.study_json import encode


def _value(rnd: random.Random, depth: int = 0):
    kind = rnd.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rnd.choice([None, True, False])
    if kind == 1:
        return rnd.choice([rnd.random() * 10 ** rnd.randrange(-300, 300), math.nan, math.inf, -math.inf, -0.0])
    if kind == 2:
        return rnd.randrange(-10 ** 30, 10 ** 30)
    if kind == 3:
        return "".join(chr(rnd.choice([rnd.randrange(0, 0x80), rnd.randrange(0x80, 0x3000), 0x1F600, 0x2028]))
                       for _ in range(rnd.randrange(8)))
    if kind == 4:
        return rnd.choice(["", "verified", 'quote " and \\ backslash', "line\nbreak"])
    if kind == 5:
        return [_value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    return {str(_value(rnd, depth + 1)) if kind == 6 else rnd.randrange(99): _value(rnd, depth + 1)
            for _ in range(rnd.randrange(4))}


def test_encode_writes_what_json_dumps_writes():
    rnd = random.Random(7)
    values = [_value(rnd) for _ in range(5000)]
    values += [{"grid": {"x": 5, "y": 1, "z": 1}, "passes": "default<O3>", "specialize": False}, 1.25, 2 ** 70]
    for value in values:
        assert encode(value) == json.dumps(value, separators=(",", ":")), value


def test_a_value_json_cannot_write_is_refused():
    with pytest.raises(TypeError):
        encode({"a": object()})
