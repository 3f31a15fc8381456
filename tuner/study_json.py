"""Compact JSON text of the study server: the journal's lines and the rows it sends the tuners."""

from __future__ import annotations

import json
from json import encoder as _encoder
from typing import Any, Callable


def _compact() -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"))`` with one C encoder made once (``JSONEncoder.encode`` makes
    one a call, which costs more than encoding a small value)."""
    plain = json.JSONEncoder(separators=(",", ":"))
    make = getattr(_encoder, "c_make_encoder", None)
    if make is None:  # (an interpreter without the C accelerator)
        return plain.encode
    # (no check for circular values: the values come out of JSON)
    chunks = make(None, plain.default, _encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    text = _encoder.encode_basestring_ascii

    def encode(value: Any) -> str:
        if value.__class__ is str:
            return text(value)
        return "".join(chunks(value, 0))

    return encode


#: A value as compact JSON text, as ``json.dumps(value, separators=(",", ":"))`` writes it.
encode = _compact()
