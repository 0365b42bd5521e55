"""`make gpu-bundle` (benchmarks/gpu_bundle.py): parts cut to size with a manifest of sha256
sums, a corrupt or missing part refused by name, and the round trip on the CPU: bundle ->
parts carried one at a time into a fresh folder -> ``run --cpu`` -> the same split hashes, none
rebuilt. The tests pack no wheels (``--no-wheels``: no download)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from benchmarks import gpu_bundle
from benchmarks.gpu_bundle import BundleError


def _bundle(tmp_path, payload: bytes, part_bytes: int):
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / gpu_bundle.PAYLOAD).write_bytes(payload)
    out = tmp_path / "bundle"
    out.mkdir()
    return out, gpu_bundle.write_parts(src / gpu_bundle.PAYLOAD, out, part_bytes)


def test_parts_are_cut_to_size_and_a_corrupt_or_missing_part_is_refused(tmp_path, capsys
                                                                        ) -> None:
    payload = os.urandom(2560)
    bundle, manifest = _bundle(tmp_path, payload, 1024)
    assert [p["bytes"] for p in manifest["parts"]] == [1024, 1024, 512]
    assert b"".join((bundle / p["name"]).read_bytes() for p in manifest["parts"]) == payload
    assert manifest["payload"]["sha256"] == hashlib.sha256(payload).hexdigest()
    # SHA256SUMS: the same sums, as `sha256sum -c` reads them
    assert (bundle / gpu_bundle.SUMS).read_text().splitlines() == [
        f"{hashlib.sha256(payload[i:i + 1024]).hexdigest()}  payload.tar.gz.{i // 1024:03d}"
        for i in range(0, 2560, 1024)]
    assert gpu_bundle.check(bundle) == (manifest, [])

    part = bundle / "payload.tar.gz.001"
    good = part.read_bytes()
    part.write_bytes(bytes([good[0] ^ 1]) + good[1:])   # one bit flipped, same size
    with pytest.raises(BundleError, match=r"1 part\(s\) differ from manifest.json.*"
                                          r"payload.tar.gz.001 \(1024 bytes, sha256 "):
        gpu_bundle.check(bundle)
    assert gpu_bundle.main(["check", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-bundle: error: ") and "Carry them again" in err
    with pytest.raises(BundleError, match="differ from manifest.json"):
        gpu_bundle.unpack(bundle, tmp_path / "work")   # refused before anything is unpacked
    assert not (tmp_path / "work").exists()

    part.write_bytes(good)
    (bundle / "payload.tar.gz.002").unlink()
    with pytest.raises(BundleError, match=r"1 of 3 parts missing: payload.tar.gz.002"):
        gpu_bundle.check(bundle)
    row = gpu_bundle.stash(bundle, tmp_path / "stash")   # a lease: parts arrive call by call
    assert row["status"] == "partial" and row["missing"] == ["payload.tar.gz.002"]


def test_stash_refuses_parts_of_another_bundle(tmp_path) -> None:
    a, _ = _bundle(tmp_path / "a", b"x" * 100, 64)
    b, _ = _bundle(tmp_path / "b", b"y" * 100, 64)
    gpu_bundle.stash(a, tmp_path / "stash")
    with pytest.raises(BundleError, match="holds parts of another bundle"):
        gpu_bundle.stash(b, tmp_path / "stash")


def test_bundle_round_trip_on_the_cpu(tmp_path, real_data, smoke_splits, procs) -> None:
    """The smoke profile's bundle (tiny-llama: no weights; --no-wheels), carried one part at a
    time into a fresh folder, unpacked elsewhere and dry-run: the same splits, none rebuilt.
    The cache also holds another profile's entry of every split, same records under another
    key, as a shared cache does: the bundle carries the entries this profile's run reads."""
    from uqbench.data.suites.build import build_suite
    from uqbench.files.cache import key_hash

    cache = tmp_path / "cache"
    shutil.copytree(smoke_splits, cache / "splits")   # the profile's splits, built once
    for path in sorted((cache / "splits" / "pooled").glob("*.json")):
        entry = json.loads(path.read_text())
        entry["key"]["caps"]["train"] = 4
        other = f"{entry['domain']}-{entry['role']}-{key_hash(entry['key'])[:24]}.json"
        (path.parent / other).write_text(json.dumps(entry))
    out = tmp_path / "bundle"
    assert gpu_bundle.main(["make", "--profile", "smoke", "--backbone", "tiny-llama",
                            "--no-wheels", "--part-mib", "1", "--cache-dir", str(cache),
                            "--data-dir", str(real_data), "--out", str(out)]) == 0
    manifest = json.loads((out / gpu_bundle.MANIFEST).read_text())
    parts = manifest["parts"]
    assert len(parts) > 1 and all(p["bytes"] <= 2**20 for p in parts)
    assert sorted(x.name for x in out.iterdir()) == sorted(
        [p["name"] for p in parts] + [gpu_bundle.MANIFEST, gpu_bundle.SUMS, "run-on-gpu.sh"])
    assert manifest["info"]["wheels"] == [] and "--no-wheels" in manifest["info"][
        "wheels_skipped"]

    lease = tmp_path / "lease"   # each device call carries one part and the manifest
    for p in parts:
        carried = tmp_path / "carried"
        shutil.rmtree(carried, ignore_errors=True)
        carried.mkdir()
        shutil.copy2(out / gpu_bundle.MANIFEST, carried)
        shutil.copy2(out / p["name"], carried)
        row = gpu_bundle.stash(carried, lease)
    assert row["status"] == "ok" and row["missing"] == []

    work, lines = tmp_path / "fresh", tmp_path / "lines.jsonl"
    assert gpu_bundle.main(["run", str(lease), "--cpu", "--work", str(work),
                            "--out", str(lines)]) == 0
    rows = {r["step"]: r for r in map(json.loads, lines.read_text().splitlines())}
    assert list(rows) == ["bundle", "env"]
    b = rows["bundle"]
    assert (b["status"], b["splits"], b["same_hashes"], b["rebuilt"]) == ("ok", 16, True, 0)
    assert b["installed"] == [] and "--no-wheels" in b["wheels_skipped"]
    assert b["work"] == str(work) and b["installed_into"] == str(work / "site")
    assert rows["env"]["status"] == "ok" and rows["env"]["dry_run"]
    # the unpacked splits are the ones the suite builds here, hash for hash
    info = json.loads((work / gpu_bundle.INFO).read_text())
    here = build_suite("pooled", "smoke", data_dir=real_data, cache_dir=smoke_splits,
                       progress=False)
    assert info["splits"] == {f"{d}/{r}": {"hash": s.hash, "records": len(s.records)}
                              for (d, r), s in here.splits.items()}
    assert sorted(x.name for x in (work / "data").iterdir()) == sorted(
        ["manifest.json", "MANIFEST.txt", *info["data_folders"]])
    assert {"arc-easy", "mmlu", "gsm8k", "mbpp", "humaneval"} <= set(info["data_folders"])
    assert "boolq" not in info["data_folders"]   # only what the suite reads


@pytest.mark.parametrize("args, message", [
    (["--profile", "nope"], "unknown profile 'nope'"),
    (["--backbone", "no-such-model"], "unknown backbone 'no-such-model'"),
])
def test_make_refuses_bad_names_before_any_work(tmp_path, capsys, args, message) -> None:
    out = tmp_path / "bundle"
    assert gpu_bundle.main(["make", "--no-wheels", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_make_never_replaces_a_folder_that_is_not_a_bundle(tmp_path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert gpu_bundle.main(["make", "--no-wheels", "--out", str(tmp_path),
                            "--data-dir", str(tmp_path)]) == 2
    assert "refusing to replace it" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
