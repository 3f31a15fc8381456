"""trials.jsonl keeps its exact format when the loop writes records from parts made once per result."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_tune_run import trials, tune

import tuner.loop
import tuner.results.directory
from replay_server.client.executor import ReplayFuture
from tuner.results.directory import dumps, dumps_record
from tuner.testing import FakeExecutor

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
                      max_leaves=12)


def _strict(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except ValueError:
        return False


@given(st.dictionaries(st.text(), values, max_size=8), st.data())
def test_a_record_from_parts_is_what_dumps_writes(record, data):
    """Some values' texts given (as the executor makes them: strict JSON), the rest encoded here; infinities
    and NaN, given nowhere, become null as dumps makes them."""
    strict = [key for key, value in record.items() if _strict(value)]
    known = {key: json.dumps(record[key]) for key in data.draw(st.lists(st.sampled_from(strict), unique=True))
             } if strict else {}
    assert dumps_record(record, known) == dumps(record)


def test_a_record_with_keys_json_would_convert_is_what_dumps_writes():
    record = {"trial": 1, 2: "two", None: math.inf}
    assert dumps_record(record, {"trial": "1"}) == dumps(record)


@pytest.mark.parametrize("instant", [1764000000.0, 1764000000.0004999, 1764000000.9995, 1764000000.9999996,
                                     1764000059.999, 1764086399.9999999])
def test_now_iso_is_datetimes_text(monkeypatch, instant):
    monkeypatch.setattr(tuner.loop.time, "time", lambda: instant)
    expected = datetime.fromtimestamp(instant, timezone.utc).isoformat(timespec="milliseconds")
    assert tuner.loop.now_iso() == expected
    assert tuner.loop.now_iso() == expected  # (the second from the cache)


class TextCarryingExecutor(FakeExecutor):
    """FakeExecutor whose futures carry the result's dict and JSON text, as AsyncReplayExecutor's do when it
    writes results.jsonl."""

    def submit(self, config):
        inner = super().submit(config)
        outer = ReplayFuture()
        outer.set_running_or_notify_cancel()

        def done(future):
            result = future.result()
            outer.result_dict = result.to_dict()
            outer.result_json = json.dumps(outer.result_dict, allow_nan=False)
            outer.set_result(result)

        inner.add_done_callback(done)
        return outer


def test_trials_written_from_the_executors_texts_are_the_same_records(tmp_path, loader, space_module,
                                                                     monkeypatch):
    # No block-shape ban: whether a banned shape's second configuration was already in flight depends on timing.
    tune(tmp_path, loader, FakeExecutor(), space_module=space_module, results_dir=str(tmp_path / "plain"),
         adaptive_invalid_ban=False)
    from_parts = []
    monkeypatch.setattr(tuner.results.directory, "dumps_record",
                        lambda record, known: from_parts.append(known) or dumps_record(record, known))
    tune(tmp_path, loader, TextCarryingExecutor(), space_module=space_module, results_dir=str(tmp_path / "texts"),
         adaptive_invalid_ban=False)
    lines = (tmp_path / "texts" / "trials.jsonl").read_text().splitlines()
    assert len(from_parts) == len(lines) and all(set(known) == {"configuration", "result"} for known in from_parts)
    assert lines and all(line == dumps(json.loads(line)) for line in lines)  # dumps's format, key for key

    def comparable(records):
        return sorted((json.dumps({k: v for k, v in r.items() if k not in ("timestamp", "elapsed_s", "trial")},
                                  sort_keys=True) for r in records))

    assert comparable(trials(tmp_path, "texts")) == comparable(trials(tmp_path, "plain"))
