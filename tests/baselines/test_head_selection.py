"""Choosing how decoders score options: the suite's ``head:`` and ``--head``, checked before any
data or model work."""
from __future__ import annotations

import pytest

from uqbench.cli import main
from uqbench.core.errors import ConfigError
from uqbench.data.suites.spec import parse_suite
from uqbench.run.runner import RunConfig, prepare

DOMAINS = {"science": {"train": {"source": "arc-easy", "split": "train"},
                       "id": {"source": "arc-easy", "split": "test"},
                       "shift": {"source": "arc-challenge", "split": "test"}}}


@pytest.mark.parametrize("head", ["cloze", "letters", "cross_encoder", "auto"])
def test_suite_head(head: str) -> None:
    assert parse_suite({"name": "s", "domains": DOMAINS, "head": head}).head == head


def test_suite_head_defaults_to_auto_and_bad_one_lists_valid() -> None:
    assert parse_suite({"name": "s", "domains": DOMAINS}).head == "auto"
    with pytest.raises(ConfigError, match=r"valid: .*cloze.*letters") as err:
        parse_suite({"name": "s", "domains": DOMAINS, "head": "logits"}, origin="my.yaml")
    assert "my.yaml" in str(err.value) and "'logits'" in str(err.value)


def test_run_head_checked_before_data(tmp_path, capsys) -> None:
    with pytest.raises(ConfigError, match="unknown head 'bogus'"):
        prepare(RunConfig(head="bogus", backbone="tiny-llama", out=tmp_path / "o"))
    assert main(["run", "--head", "clozee", "--backbone", "tiny-llama",
                 "--out", str(tmp_path / "o2")]) == 2       # the CLI too, before any output
    assert "unknown head 'clozee'" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_head_in_run_identity_only_when_given() -> None:
    assert "head" not in RunConfig().identity()   # old runs keep their identity
    assert RunConfig(head="cloze").identity()["head"] == "cloze"
