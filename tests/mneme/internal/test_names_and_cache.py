"""Request validation (nothing outside the store) and the prepared-instance LRU."""

from __future__ import annotations

import os

import pytest

from mneme._internal.names import validate_record_id, validate_store_key
from mneme.errors import ConfigurationError
from mneme.store.keys import resolve_in_store
from replay_server.server.prepared_cache import PreparedCache


@pytest.mark.parametrize("key", [
    "../etc/passwd", "a/../../b.json", "/etc/passwd", "", ".hidden.json", "a//b.json", "a\\b.json", "x\x00.json",
    "a/./b.json", "spaced name.json",
])
def test_bad_store_keys_are_refused(key):
    with pytest.raises(ConfigurationError):
        validate_store_key(key)


@pytest.mark.parametrize("key", ["123.json", "runs/vecadd/15941914485064662553.json", "a-b_c.json"])
def test_good_store_keys_pass(key):
    assert validate_store_key(key) == key


@pytest.mark.parametrize("record_id", ["", "../x", "a b", "x" * 200, "1;rm"])
def test_bad_record_ids_are_refused(record_id):
    with pytest.raises(ConfigurationError):
        validate_record_id(record_id)


def test_symlink_out_of_the_store_is_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    os.symlink(tmp_path / "secret.json", store / "link.json")
    with pytest.raises(ConfigurationError, match="outside the store"):
        resolve_in_store(str(store), "link.json")
    assert resolve_in_store("s3://bucket/prefix/", "a/1.json") == "s3://bucket/prefix/a/1.json"


class _Held:
    def __init__(self, name, size, closed):
        self.name, self.device_bytes, self.healthy, self._closed = name, size, True, closed

    def close(self):
        self._closed.append(self.name)


def test_prepared_cache_evicts_least_recently_used_by_device_memory():
    closed: list[str] = []
    cache = PreparedCache(capacity_bytes=100)
    opened = []

    def opener(name, size):
        def open_():
            opened.append(name)
            return _Held(name, size, closed)
        return open_

    cache.get("a", opener("a", 40))
    cache.get("b", opener("b", 40))
    cache.get("a", opener("a", 40))  # a is now the most recent; not reopened
    cache.get("c", opener("c", 40))  # 120 > 100: b (least recent) goes
    assert opened == ["a", "b", "c"] and closed == ["b"] and cache.keys() == ["a", "c"]
    cache.get("huge", opener("huge", 500))  # larger than the budget: everything else goes, it stays
    assert cache.keys() == ["huge"] and closed == ["b", "a", "c"]
    cache.close()
    assert closed[-1] == "huge"
