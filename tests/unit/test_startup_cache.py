"""Start-up records (utils/startup_cache.py): written whole, read back, named by their inputs,
bounded in number, and listed and cleared by `radixserve cache`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixserve.utils import startup_cache
from radixserve.utils.cache_dir import CACHE_DIR_ENV


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def test_a_record_reads_back() -> None:
    key = startup_cache.key_of(["a", b"b"])
    assert startup_cache.read_record("kind", key) is None
    startup_cache.write_record("kind", key, {"x": [1, 2]})
    assert startup_cache.read_record("kind", key) == {"x": [1, 2]}
    assert startup_cache.read_record("other", key) is None


def test_keys_tell_their_parts_apart() -> None:
    assert startup_cache.key_of(["ab", "c"]) != startup_cache.key_of(["a", "bc"])
    assert startup_cache.key_of(["a"]) == startup_cache.key_of([b"a"])


def test_an_unreadable_record_is_a_miss() -> None:
    path = startup_cache.record_path("kind", "k")
    path.parent.mkdir(parents=True)
    path.write_text("{half")
    assert startup_cache.read_record("kind", "k") is None


def test_a_value_json_cannot_hold_is_not_written() -> None:
    startup_cache.write_record("kind", "k", {"x": {1, 2}})
    assert not startup_cache.record_path("kind", "k").exists()


def test_the_oldest_records_go_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup_cache, "MAX_RECORDS", 3)
    for i in range(5):
        startup_cache.write_record("kind", str(i), {"i": i})
        os.utime(startup_cache.record_path("kind", str(i)), (i, i))
    startup_cache.write_record("kind", "last", {})
    left = sorted(p.name for p in startup_cache.record_path("kind", "x").parent.iterdir())
    assert left == ["kind-3.json", "kind-4.json", "kind-last.json"]


def test_the_cache_command_lists_and_clears_them(capsys: pytest.CaptureFixture[str]) -> None:
    from radixserve.cli import main

    startup_cache.write_record("kind", "k", {})
    assert main(["cache", "list"]) == 0
    assert "startup" in capsys.readouterr().out
    assert main(["cache", "clear", "startup"]) == 0
    assert startup_cache.read_record("kind", "k") is None
