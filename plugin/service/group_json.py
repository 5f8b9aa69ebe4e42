"""One group as plain JSON: the fields every reader of a group shows, in one order.

``status`` (the CLI and the NATS status responder), the frontend's ``/workersets`` page and
``replay`` all show a group through :func:`group_json`: its plain fields and ids, incumbent,
status, generation, receiver, admitted ids and cohorts in order; a drained worker through
:func:`drained_json` and a handover through :func:`handover_json`. What only a serving
frontend knows (the committed generation, the routable ids) comes in as ``serving``, in the
places the status has always shown it. Each caller adds after these what only it shows: the
status its hold and counts as Unix time, replay a hold on the trace's clock and only when
there is one (see ``status_model.py`` and ``traces/replay.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from workerset_admission.identity import GroupKey, group_fields

__all__ = ["Serving", "drained_json", "group_json", "handover_json", "id_list"]


class Serving(NamedTuple):
    """What a serving frontend shows of a group besides its decision."""

    committed_generation: int | None
    routable: Sequence[int]


def id_list(values: Sequence[int], brief: bool = False) -> list[int] | int:
    """Return instance ids as a list, or only how many there are when ``brief``."""
    return len(values) if brief else list(values)


def group_json(
    group: GroupKey,
    *,
    incumbent: str | None,
    status: str,
    generation: int | None,
    receiver: int | None,
    admitted: Sequence[int],
    cohorts: Iterable[tuple[str, Sequence[int]]],
    serving: Serving | None = None,
    brief: bool = False,
) -> dict[str, Any]:
    """Return one group's plain JSON; ``cohorts`` are (checksum, sorted member ids) in order.

    ``brief`` gives every id list as a count.
    """
    out = group_fields(group)
    out["incumbent"] = incumbent
    out["status"] = status
    out["generation"] = generation
    if serving is not None:
        out["committed_generation"] = serving.committed_generation
    out["receiver"] = receiver
    out["admitted"] = id_list(admitted, brief)
    if serving is not None:
        out["routable"] = id_list(serving.routable, brief)
    out["cohorts"] = [
        {"checksum": checksum, "members": id_list(members, brief)} for checksum, members in cohorts
    ]
    return out


def drained_json(
    drained: Iterable[tuple[int, str, float | None]], checksums: Mapping[int, str] | None = None
) -> list[dict[str, Any]]:
    """Return the workers a drain set aside: (instance id, who drained it, when), in order.

    ``checksums`` (a status has them) adds each drained worker's card checksum.
    """
    if checksums is None:
        return [{"instance_id": i, "by": by, "at": at} for i, by, at in drained]
    return [
        {"instance_id": i, "by": by, "at": at, "checksum": checksums.get(i)}
        for i, by, at in drained
    ]


def handover_json(
    checksum: str, committed_generation: int, members: Sequence[int], brief: bool = False
) -> dict[str, Any]:
    """Return a drained tenure serving its drained members until its successor commits."""
    return {
        "checksum": checksum,
        "committed_generation": committed_generation,
        "members": id_list(members, brief),
    }
