"""One key, one identity: no two bucket keys name one registration or one view file.

Dynamo joins names with ``/`` into its discovery paths and its file store names each record's
file after the whole path, so the boundary refuses a key whose names hold ``/`` (two keys would
be one path) and a key whose file name would pass what a file system takes (the worker could
never be routed to). Every key it accepts names a path, and a file, of its own.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from workerset_admission.adapters.dynamo.view_directory import file_name_for
from workerset_admission.card import escape_token, parse_key
from workerset_admission.card.events import dynamo_event_path, parse_event_key
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import STORE_NAME_MAX

# Names from every byte a UTF-8 name may hold, short and long, with '/' and '%' common.
_NAMES = st.one_of(
    st.text(min_size=1, max_size=12),
    st.text(alphabet="/%=._-aZ9", min_size=1, max_size=12),
    st.text(alphabet="a/", min_size=60, max_size=300),
    st.text(min_size=60, max_size=120),
)


def _view_file(kv_key: str) -> tuple[str, str, str]:
    """Return (registration key, bucket, file name) of an accepted key, as the view names it."""
    if kv_key.startswith("v1.event_"):
        event = parse_event_key(kv_key)
        path = dynamo_event_path(event)
        return f"{event.bucket}:{path}", event.bucket, file_name_for(path)
    parsed = parse_key(kv_key)
    bucket = "mdc" if parsed.kind == "model" else "instances"
    return parsed.instance_key, bucket, file_name_for(parsed.instance_key)


@st.composite
def _keys(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["mdc", "instances", "event_sources"]))
    names = [escape_token(draw(_NAMES)) for _ in range(3)]
    instance = f"{draw(st.integers(0, 2**64 - 1)):x}"
    if kind == "event_sources":
        ns, comp, ep = names
        return f"v1.event_sources.namespace.{ns}.component.{comp}.endpoint.{ep}.topic.t.{instance}"
    key = f"v1.{kind}.{'.'.join(names)}.{instance}"
    if kind == "mdc" and draw(st.booleans()):
        key += "." + escape_token(draw(_NAMES))
    return key


def _accepted(kv_key: str) -> tuple[str, str, str] | None:
    try:
        return _view_file(kv_key)
    except InvalidRecordError as exc:
        if exc.reason != "bad_key":
            raise
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(_keys(), min_size=2, max_size=6, unique=True))
def test_no_two_accepted_keys_share_a_registration_or_a_view_file(keys: list[str]) -> None:
    seen_paths: dict[str, str] = {}
    seen_files: dict[tuple[str, str], str] = {}
    for key in keys:
        named = _accepted(key)
        if named is None:
            continue
        path, bucket, name = named
        assert seen_paths.setdefault(f"{bucket}:{path}", key) == key
        assert seen_files.setdefault((bucket, name), key) == key
        assert len(name.encode()) <= STORE_NAME_MAX


def test_a_name_holding_a_slash_is_refused_so_two_keys_cannot_be_one_worker() -> None:
    # ns "dgd", component "backend/generate" and ns "dgd/backend", component "generate" are
    # both the path dgd/backend/generate/x/1.
    with pytest.raises(InvalidRecordError, match="separator") as info:
        parse_key("v1.mdc.dgd.backend=2Fgenerate.x.1")
    assert info.value.reason == "bad_key"
    with pytest.raises(InvalidRecordError, match="separator"):
        parse_key("v1.instances.dgd=2Fbackend.generate.x.1")
    with pytest.raises(InvalidRecordError, match="separator"):
        parse_key("v1.mdc.dgd.backend.generate.1.lora=2Fa")


@pytest.mark.parametrize(
    "key",
    [
        "v1.mdc." + "n" * 250 + ".backend.generate.1",
        "v1.instances." + "=25" * 85 + ".backend.generate.1",
        "v1.mdc.ns.backend.generate.1." + "a_" * 90,
        "v1.event_channels.namespace." + "=25" * 60 + ".topic.kv-events.1",
    ],
)
def test_a_key_whose_view_file_name_passes_255_bytes_is_refused_with_a_reason(key: str) -> None:
    with pytest.raises(InvalidRecordError, match="over the 255") as info:
        _view_file(key)
    assert info.value.reason == "bad_key"


def test_the_longest_nameable_key_is_accepted_and_its_file_fits() -> None:
    # The boundary sits exactly at the file system's limit, not below it.
    tail = "/backend/generate/1"
    room = STORE_NAME_MAX - len(file_name_for(tail))
    fits = "v1.mdc." + "n" * room + ".backend.generate.1"
    assert len(file_name_for(parse_key(fits).instance_key)) == STORE_NAME_MAX
    with pytest.raises(InvalidRecordError):
        parse_key("v1.mdc." + "n" * (room + 1) + ".backend.generate.1")
