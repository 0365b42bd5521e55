"""docs/extending.md's "A backbone" example, verbatim (tests: test_backbones, test_readme)."""
# my_backbones.py:  uqbench run --plugin my_backbones --backbone my-bert ...
from pathlib import Path

from baselines.backbones import Backbone, load_folder, register_backbone
from uqbench.core.errors import ConfigError

FOLDER = Path("models/my-bert")  # a Hugging Face folder: config.json, weights, tokenizer

def check() -> None:  # runs before any data work: a missing folder is a clear error
    if not (FOLDER / "config.json").is_file():
        raise ConfigError(f"backbone 'my-bert' needs {FOLDER}/config.json")

@register_backbone("my-bert", check=check)
def my_bert(*, dtype=None, device=None, cache_dir=None) -> Backbone:
    return load_folder(FOLDER, "my-bert", dtype=dtype, device=device)
