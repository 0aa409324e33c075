"""The walk over a prompt's chain keys that every prefix lookup shares (`prefix.chains`: a key names its
whole prefix, so the leading keys a store holds are the prompt's cached prefix)."""

from __future__ import annotations


def leading_held(keys, held) -> int:
    """Pure. How many leading chain `keys` (an iterable of ints) are in `held` (anything with `in`): a key
    names its whole prefix, so the walk stops at the first one missing."""
    n = 0
    for key in keys:
        if key not in held:
            break
        n += 1
    return n
