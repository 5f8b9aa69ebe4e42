"""File names of CheckedFile paths, as 1.6.1 derives them for ``extra_files`` in mdcsum.

A CheckedFile path is first parsed as a WHATWG URL (Rust's ``url`` crate); the name is then
``Path::file_name`` of the URL's serialized path (percent-encoded, dot segments resolved, so
``https://h/a/b/`` names ``b`` and ``tok:en.json`` names ``en.json``). A string that is not a
URL is a filesystem path and the name is its ``Path::file_name``.
"""

from __future__ import annotations

import re

__all__ = ["file_basename"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*:")
_SPECIAL = {"http", "https", "ws", "wss", "ftp", "file"}
# WHATWG path percent-encode set: C0 controls, space, ", #, <, >, ?, `, {, }, and non-ASCII.
_PATH_ENCODE = (
    set(range(0x21)) | {0x22, 0x23, 0x3C, 0x3E, 0x3F, 0x60, 0x7B, 0x7D} | set(range(0x7F, 0x100))
)
_C0_TAB_NL = re.compile(r"[\t\n\r]")
# URL parsing trims leading and trailing C0 controls and spaces.
_C0_AND_SPACE = "".join(chr(c) for c in range(0x21))


def _encode_segment(segment: str) -> str:
    return "".join(
        f"%{byte:02X}" if byte in _PATH_ENCODE else chr(byte)
        for byte in segment.encode("utf-8", "surrogatepass")
    )


def _is_single_dot(segment: str) -> bool:
    return segment == "." or segment.lower() == "%2e"


def _is_double_dot(segment: str) -> bool:
    return segment.lower() in ("..", ".%2e", "%2e.", "%2e%2e")


def _encode_opaque(text: str) -> str:
    return "".join(
        f"%{byte:02X}" if byte < 0x20 or byte >= 0x7F else chr(byte)
        for byte in text.encode("utf-8", "surrogatepass")
    )


class _NotAUrl(Exception):
    """The text does not parse as a URL; it is then read as a filesystem path."""


# Code points a URL host may not contain (WHATWG "forbidden host code point"); a special
# scheme's domain also refuses ``%`` after decoding and any control or space.
_FORBIDDEN_HOST = frozenset(" #/:<>?@[\\]^|\t\n\r\x00")


def _check_authority(authority: str, special: bool) -> None:
    host_port = authority.rpartition("@")[2]
    if host_port.startswith("["):
        end = host_port.find("]")
        if end < 0 or not all(c in "0123456789abcdefABCDEF:." for c in host_port[1:end]):
            raise _NotAUrl
        host, port = host_port[: end + 1], host_port[end + 1 :]
        if port and not port.startswith(":"):
            raise _NotAUrl
        port = port[1:]
    else:
        host, _, port = host_port.partition(":")
        if ":" in port:
            raise _NotAUrl
        if any(c in _FORBIDDEN_HOST or ord(c) < 0x20 for c in host):
            raise _NotAUrl
        if special and ("%" in host or not host):
            raise _NotAUrl
        if special and not _ipv4_ok(host):
            raise _NotAUrl
    if port and (not port.isascii() or not port.isdigit() or int(port) > 65535):
        raise _NotAUrl


def _ipv4_number(part: str) -> int | None:
    if part[:2].lower() == "0x":
        digits, base = part[2:], 16
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not digits:
        return 0 if base == 16 else None
    try:
        return int(digits, base) if digits.isascii() and digits.isalnum() else None
    except ValueError:
        return None


def _ipv4_ok(host: str) -> bool:
    """Check a host that ends in a number parses as IPv4, as WHATWG requires."""
    labels = host.split(".")
    if labels[-1] == "" and len(labels) > 1:
        labels.pop()
    last = labels[-1]
    ends_in_number = (last.isascii() and last.isdigit()) or (
        last[:2].lower() == "0x" and all(c in "0123456789abcdefABCDEF" for c in last[2:])
    )
    if not ends_in_number:
        return True
    if len(labels) > 4:
        return False
    numbers = [_ipv4_number(label) for label in labels]
    if any(n is None for n in numbers):
        return False
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]):
        return False
    limit: int = 256 ** (5 - len(values))
    return values[-1] < limit


def _url_path(scheme: str, rest: str) -> str:
    """Serialize a URL's path (dot segments resolved, percent-encoded)."""
    special = scheme in _SPECIAL
    if special:
        rest = rest.replace("\\", "/")
        if scheme != "file":
            # Special schemes always have an authority: any run of slashes (even none, as
            # in ``http:host/x``) comes before the host, so ``https:///x.json`` names host x.json.
            rest = "//" + rest.lstrip("/")
    if rest.startswith("//"):
        after = rest[2:]
        cut = len(after)
        for stop in "/?#":
            pos = after.find(stop)
            if pos != -1:
                cut = min(cut, pos)
        if scheme != "file" or after[:cut]:
            _check_authority(after[:cut], special)
        path = after[cut:]
    elif special:
        path = "/" + rest.lstrip("/")
    elif rest.startswith("/"):
        path = rest
    else:
        # An opaque path (``tok:en.json``, ``mailto:a@b``): kept as written, minus query/fragment.
        for stop in "?#":
            pos = rest.find(stop)
            if pos != -1:
                rest = rest[:pos]
        return _encode_opaque(rest)
    for stop in "?#":
        pos = path.find(stop)
        if pos != -1:
            path = path[:pos]
    segments: list[str] = []
    parts = path.split("/")[1:] if path.startswith("/") else path.split("/")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if _is_double_dot(part):
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif _is_single_dot(part):
            if last:
                segments.append("")
        else:
            segments.append(_encode_segment(part))
    return "/" + "/".join(segments)


def _path_file_name(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return ""
    last = parts[-1]
    return "" if last == ".." else last


def file_basename(path: str) -> str:
    """Return the name 1.6.1 hashes for an ``extra_files`` entry ("" when there is none)."""
    text = path.strip(_C0_AND_SPACE)
    text = _C0_TAB_NL.sub("", text)
    match = _SCHEME.match(text)
    if match:
        scheme = match.group(0)[:-1].lower()
        try:
            return _path_file_name(_url_path(scheme, text[match.end() :]))
        except _NotAUrl:
            pass
    return _path_file_name(path)
