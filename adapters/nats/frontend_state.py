"""Which frontends are live, and one frontend's status, read over NATS for ``record``."""

from __future__ import annotations

from nats.errors import Error as NatsError
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
from workerset_admission.adapters.nats.status import frontend_subject
from workerset_admission.card.serving_record import Record, live_records, parse_record
from workerset_admission.errors import InvalidRecordError, Unreachable, error_in_words

__all__ = ["frontend_status", "live_frontends"]


async def live_frontends(
    options: NatsConnectOptions, admission_bucket: str, timeout: float = 10.0
) -> tuple[str, ...]:
    """List the live frontends of the serving-admission bucket (by their heartbeat), sorted."""
    read = await NatsRecordSource(options, admission_bucket, timeout=timeout).read()
    if read.problem is not None:
        raise Unreachable(read.problem)
    records: list[Record] = []
    for entry in read.entries:
        try:
            records.append(parse_record(entry.key, entry.value, entry.published_at))
        except InvalidRecordError:  # noqa: PERF203 - one bad record skips only itself
            continue
    return tuple(sorted({record.frontend for record in live_records(records)}))


async def frontend_status(
    options: NatsConnectOptions, status_subject: str, frontend: str, timeout: float = 5.0
) -> bytes:
    """Ask one frontend, by its own status subject, for its status now, as it answered.

    What the answer means (a decision state for a trace, say) is for the caller to read.
    """
    client = await connect(options, allow_reconnect=False)
    try:
        try:
            reply = await client.request(
                frontend_subject(status_subject, frontend), b"", timeout=timeout
            )
        except (NatsError, TimeoutError, OSError) as exc:
            raise Unreachable(
                f"frontend {frontend} did not answer a status request: "
                f"{error_in_words(exc, timeout=timeout)}"
            ) from None
        data: bytes = reply.data
        return data
    finally:
        await client.close()
