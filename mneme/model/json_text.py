"""JSON text of the per-result records, byte for byte what ``json.dumps`` writes, at a fraction of its cost.

Why: a tuning client handles every result on one core of Python. Per result it hashes the configuration
(canonical JSON + SHA-256) and writes it twice (``results.jsonl`` of the executor, ``trials.jsonl`` of
the tuner). ``json.dumps`` of a configuration's dict costs several times what making the dict does; a
configuration has a fixed shape, so a format string gives the same text at about the dict's cost. A
configuration is immutable, so
:class:`~mneme.model.experiment.ExperimentConfiguration` keeps both texts once made.

A field holding a type that ``ExperimentConfiguration.from_dict`` never stores there (``True`` for an
integer, a float for a dimension) gets ``None`` here, and the caller uses ``json.dumps``: the text is
always exactly what ``json.dumps`` writes.
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder
from json.encoder import (
    encode_basestring_ascii as _string,  # json.dumps's own (C) string encoder
)
from typing import Any, Callable

_int, _bool_type, _str = int, bool, str


def _plain_types(c: Any) -> bool:
    """Every field holds the type ``from_dict`` gives it (what the format strings below assume).
    Spelled out: a loop over the field names would cost more than the text it guards."""
    g, b, t, m = c.grid, c.block, c.max_threads, c.min_blocks_per_sm
    return (type(g.x) is _int and type(g.y) is _int and type(g.z) is _int and type(b.x) is _int
            and type(b.y) is _int and type(b.z) is _int and type(c.shared_mem) is _int
            and type(c.codegen_opt) is _int and (t is None or type(t) is _int) and (m is None or type(m) is _int)
            and type(c.specialize) is _bool_type and type(c.set_launch_bounds) is _bool_type
            and type(c.specialize_dims) is _bool_type and type(c.prune) is _bool_type
            and type(c.internalize) is _bool_type and type(c.passes) is _str and type(c.codegen_method) is _str)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _bound(value: int | None) -> str:
    return "null" if value is None else str(value)


def configuration_json(config: Any) -> str | None:
    """``json.dumps(config.to_dict())``: the file form (field order, ``", "`` and ``": "``), or None."""
    if not _plain_types(config):
        return None
    g, b = config.grid, config.block
    return (f'{{"grid": {{"x": {g.x}, "y": {g.y}, "z": {g.z}}}, "block": {{"x": {b.x}, "y": {b.y}, "z": {b.z}}}, '
            f'"shared_mem": {config.shared_mem}, "specialize": {_bool(config.specialize)}, '
            f'"set_launch_bounds": {_bool(config.set_launch_bounds)}, "max_threads": {_bound(config.max_threads)}, '
            f'"min_blocks_per_sm": {_bound(config.min_blocks_per_sm)}, '
            f'"specialize_dims": {_bool(config.specialize_dims)}, "passes": {_string(config.passes)}, '
            f'"codegen_opt": {config.codegen_opt}, "codegen_method": {_string(config.codegen_method)}, '
            f'"prune": {_bool(config.prune)}, "internalize": {_bool(config.internalize)}}}')


def canonical_configuration_json(config: Any) -> str | None:
    """``json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))``: what the hash is of, or None."""
    if not _plain_types(config):
        return None
    g, b = config.grid, config.block
    return (f'{{"block":{{"x":{b.x},"y":{b.y},"z":{b.z}}},"codegen_method":{_string(config.codegen_method)},'
            f'"codegen_opt":{config.codegen_opt},"grid":{{"x":{g.x},"y":{g.y},"z":{g.z}}},'
            f'"internalize":{_bool(config.internalize)},"max_threads":{_bound(config.max_threads)},'
            f'"min_blocks_per_sm":{_bound(config.min_blocks_per_sm)},"passes":{_string(config.passes)},'
            f'"prune":{_bool(config.prune)},"set_launch_bounds":{_bool(config.set_launch_bounds)},'
            f'"shared_mem":{config.shared_mem},"specialize":{_bool(config.specialize)},'
            f'"specialize_dims":{_bool(config.specialize_dims)}}}')


def json_encoder(allow_nan: bool = True, default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """``json.JSONEncoder(allow_nan=allow_nan, default=default).encode``, for records written per result.

    json makes its C encoder anew on every call (a good share of encoding a result); this one is made
    once. It leaves out the circular-reference check, which plain trees of dicts, lists and scalars (the
    records) never need. Where json has no C encoder, json's own ``encode``.
    """
    encoder = json.JSONEncoder(allow_nan=allow_nan, default=default)
    if c_make_encoder is None:
        return encoder.encode
    chunks = c_make_encoder(None, encoder.default, _string, None, ": ", ", ", False, False, allow_nan)

    def encode(value: Any) -> str:
        if type(value) is str:
            return _string(value)
        return "".join(chunks(value, 0))

    return encode
