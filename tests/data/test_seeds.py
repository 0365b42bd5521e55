"""`uqbench.data.seeds.derive_seed` reproduces, bit for bit, the three seed derivations the
cached splits were built with (written out here with hashlib, as they read before the merge)."""
from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from uqbench.data.seeds import derive_seed

IDS = st.text(min_size=0, max_size=30)


@given(st.integers(0, 2**31), IDS, IDS)
def test_the_three_former_formulas(seed: int, a: str, b: str) -> None:
    pool = hashlib.sha256("/".join([str(seed), a, b]).encode()).digest()
    assert derive_seed(seed, a, b) == int.from_bytes(pool[:8], "little")
    item = int(hashlib.sha256(f"{seed}/{a}".encode()).hexdigest()[:8], 16)
    assert derive_seed(seed, a, nbytes=4, byteorder="big") == item
    rec = hashlib.sha256(f"{seed}\x00{a}\x00{b}".encode()).digest()
    assert derive_seed(seed, a, b, sep="\x00", nbytes=16, byteorder="big") == \
        int.from_bytes(rec[:16], "big")


def test_hand_value() -> None:
    # sha256(b"0/mbpp/11") starts d22dfba3 (hashlib), 0xd22dfba3 = 3526228899
    assert hashlib.sha256(b"0/mbpp/11").hexdigest()[:8] == "d22dfba3"
    assert derive_seed(0, "mbpp/11", nbytes=4, byteorder="big") == 3526228899
