"""What a structure holds, in bytes: every object it reaches that nothing given reaches too."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable


def _reached(roots: Iterable[object]) -> dict[int, object]:
    seen: dict[int, object] = {}
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
        if isinstance(obj, dict):
            todo.extend(obj)  # a map with str keys does not name them as referents
    return seen


def held_size(structure: object, besides: Iterable[object] = ()) -> int:
    """Sum ``sys.getsizeof`` over what ``structure`` reaches and ``besides`` does not.

    Interned strings (bucket names, the endpoint's names) are everyone's and not counted.
    Deterministic for one interpreter version: a fast test may bound it.
    """
    theirs = _reached(besides)
    total = 0
    for key, obj in _reached([vars(structure)]).items():
        if key in theirs or (isinstance(obj, str) and sys.intern(obj) is obj):
            continue
        total += sys.getsizeof(obj)
    return total
