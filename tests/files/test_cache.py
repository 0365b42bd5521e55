"""The on-disk cache (`uqbench.files.cache`): atomic entries addressed by key material, stale
and corrupt entries detected and rebuilt, orphans swept, the source hash of cache keys."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from uqbench.files.cache import ArrayCache, DirCache, StaleCacheWarning, key_hash

KEY = {"backbone": "minilm", "split": "abc", "protocol": "1"}


def test_round_trip_and_hit(tmp_path):
    c = ArrayCache(tmp_path)
    calls = []

    def compute():
        calls.append(1)
        return {"logits": np.arange(6.0).reshape(3, 2)}

    a, hit = c.get_or_compute("fwd", KEY, compute)
    b, hit2 = c.get_or_compute("fwd", KEY, compute)
    assert (hit, hit2) == (False, True) and len(calls) == 1
    np.testing.assert_array_equal(a["logits"], b["logits"])
    assert not list((tmp_path / "fwd").glob("*.tmp"))


def test_scalars_share_one_member_and_come_back_exactly(tmp_path):
    """0-d arrays (a scoring entry has hundreds) are one JSON member, read back bit for bit
    with their dtypes; arrays stay npz members; an entry written one member per scalar (the
    format before) still reads."""
    import json
    import zipfile

    from uqbench.files.cache import SCALARS

    arrays = {"f": np.float64(0.1 + 0.2), "nan": np.float64("nan"), "inf": np.float64("-inf"),
              "f32": np.float32(1 / 3), "i": np.int64(-7), "b": np.bool_(True),
              "s": np.asarray("a | b"), "empty": np.asarray(""), "v": np.arange(3.0)}
    c = ArrayCache(tmp_path)
    path = c.put("k", {"m": 1}, arrays)
    assert sorted(zipfile.ZipFile(path).namelist()) == sorted(
        [f"{SCALARS}.npy", "__key__.npy", "v.npy"]
    )
    got = c.get("k", {"m": 1})
    assert got.keys() == arrays.keys()
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].shape == np.shape(a), name
        assert got[name].tobytes() == np.asarray(a).tobytes(), name
    old = c.path("k", {"m": 2})   # the format before: one member per scalar
    with open(old, "wb") as f:
        np.savez(f, __key__=np.array(json.dumps({"m": 2})), x=np.float64(2.5))
    assert c.get("k", {"m": 2}) == {"x": 2.5}


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_entry_is_recomputed(tmp_path, damage):
    c = ArrayCache(tmp_path)
    path = c.put("fwd", KEY, {"x": np.ones(1000)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a zip" * 10)
    with pytest.warns(StaleCacheWarning, match="unreadable"):
        assert c.get("fwd", KEY) is None
    assert not path.exists()


def test_key_mismatch_is_stale(tmp_path):
    c = ArrayCache(tmp_path)
    other = dict(KEY, split="changed")
    # simulate a collision: the file for KEY holds arrays written for another key
    c.put("fwd", other, {"x": np.zeros(2)})
    c.path("fwd", other).rename(c.path("fwd", KEY))
    with pytest.warns(StaleCacheWarning, match="does not match"):
        assert c.get("fwd", KEY) is None


def test_changed_material_changes_address():
    assert key_hash(KEY) != key_hash(dict(KEY, protocol="2"))
    assert key_hash({"a": 1, "b": 2}) == key_hash({"b": 2, "a": 1})


def test_dir_cache_publishes_sealed_folder_and_detects_tampering(tmp_path):
    c = DirCache(tmp_path)
    assert c.get("models", KEY) is None
    path = c.build("models", KEY, lambda d: (d / "w.bin").write_bytes(b"weights"))
    assert c.get("models", KEY) == path
    (path / "w.bin").write_bytes(b"tampered")
    with pytest.warns(StaleCacheWarning):
        assert c.get("models", KEY) is None


def test_dir_cache_failed_build_leaves_nothing(tmp_path):
    c = DirCache(tmp_path)

    def boom(d):
        (d / "partial").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        c.build("models", KEY, boom)
    assert c.get("models", KEY) is None
    assert not any((tmp_path / "models").iterdir())


def test_sweep_removes_only_this_hosts_dead_writers_temporaries(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    from uqbench.files.cache import sweep_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid now names no process (reuse within this test is negligible)
    host = socket.gethostname()
    (tmp_path / "forward").mkdir()
    killed_file = tmp_path / "forward" / f".abc.npz.{host}.{dead.pid}.0123abcd.tmp"
    killed_dir = tmp_path / f".model.{host}.{dead.pid}.89abcdef.tmp"
    live = tmp_path / "forward" / f".def.npz.{host}.{os.getpid()}.0123abcd.tmp"
    other_host = tmp_path / f".ghi.npz.{host}x.{dead.pid}.0123abcd.tmp"
    foreign = tmp_path / ".notes.tmp"
    killed_dir.mkdir()
    (killed_dir / "adapter.safetensors").write_bytes(b"half")
    for f in (killed_file, live, other_host, foreign):
        f.write_bytes(b"x")
    assert sweep_orphans(tmp_path) == 2
    assert not killed_file.exists() and not killed_dir.exists()
    assert live.exists() and other_host.exists() and foreign.exists()
    assert sweep_orphans(tmp_path) == 0


def test_source_hash_covers_every_module_of_a_package(tmp_path, monkeypatch) -> None:
    """A cache key built from a package's source changes when one of its submodules does
    (``inspect.getsource`` of a package reads only its ``__init__``)."""
    import importlib
    import sys

    from uqbench.files.cache import source_hash

    pkg = tmp_path / "srchashpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from srchashpkg.part import f\n")
    (pkg / "part.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = source_hash(importlib.import_module("srchashpkg"))
    (pkg / "part.py").write_text("def f():\n    return 2 + 2\n")  # another size too
    for name in ("srchashpkg", "srchashpkg.part"):
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    assert source_hash(importlib.import_module("srchashpkg")) != before
    assert source_hash(importlib.import_module("srchashpkg"), extra="x") != source_hash(
        importlib.import_module("srchashpkg"))


def test_the_cache_folder_is_chosen_in_one_place(monkeypatch, tmp_path) -> None:
    from uqbench.files.cache import resolve_cache_dir

    monkeypatch.delenv("UQBENCH_CACHE", raising=False)
    assert resolve_cache_dir() == Path(".uqbench-cache")
    monkeypatch.setenv("UQBENCH_CACHE", str(tmp_path))
    assert resolve_cache_dir() == tmp_path
    assert resolve_cache_dir(tmp_path / "given") == tmp_path / "given"
