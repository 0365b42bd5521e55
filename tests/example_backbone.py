"""The README's "Adding a backbone" example, verbatim but for FOLDER (tests: test_backbones)."""
from pathlib import Path

from baselines.backbones import Backbone, load_folder, minilm_path, register_backbone
from uqbench.errors import ConfigError

FOLDER = Path(minilm_path())  # README: Path("models/my-bert"), any Hugging Face model folder


def check() -> None:  # runs before any data work: a missing folder is a clear error
    if not (FOLDER / "config.json").is_file():
        raise ConfigError(f"backbone 'my-bert' needs {FOLDER}/config.json")


@register_backbone("my-bert", check=check)
def my_bert(*, dtype=None, device=None, cache_dir=None) -> Backbone:
    return load_folder(FOLDER, "my-bert", dtype=dtype, device=device)
