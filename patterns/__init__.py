"""The pattern catalog: one module per sampling idiom, all registered on ``PASS``.

Each idiom module holds the idiom as users write it (``search``), the strict ``check`` that
accepts a match, and its terminal op (``TARGET``); ``_chain.py`` holds what they share
(the walk back to the LM head and the rewrite into one ``fused_sample`` call). Adding an
idiom means adding a module here and to ``IDIOMS``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import exponential_race, greedy, gumbel, multinomial
from ._chain import PASS, register

# The argmax idioms share their anchor: the noisy ones are tried before greedy.
IDIOMS = (multinomial, exponential_race, gumbel, greedy)
for _idiom in IDIOMS:
    register(_idiom.IDIOM, _idiom.TARGET, _idiom.check)

__all__ = ["IDIOMS", "PASS", "source_hash"]


def source_hash() -> str:
    """Hash of the catalog's source: a new pattern set must not reuse cached graphs."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
