"""File names of extra_files entries, as 1.6.1 derives them (each pair checked against it)."""

from __future__ import annotations

import pytest
from workerset_admission.card.paths import file_basename


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/models/m/config.json", "config.json"),
        ("hf://Org/Model/tokenizer.json", "tokenizer.json"),
        ("https://h/a/b/", "b"),
        ("https://h/a/%7Bx%7D.json", "%7Bx%7D.json"),
        ("https://h/a/{x} y.json", "%7Bx%7D%20y.json"),
        ("https://h/a/../b/./c.json", "c.json"),
        ("https://h/a/b/..", "a"),
        ("https://h/a/b/.", "b"),
        ("https://h/a\\b\\c.json", "c.json"),
        ("http://h", ""),
        ("http://h?x=1#f", ""),
        ("file:///tmp/x/y.json", "y.json"),
        ("file:///tmp/x/", "x"),
        ("tok:en.json", "en.json"),
        ("tok:/a/b.json", "b.json"),
        ("s3://bucket/key/obj.bin", "obj.bin"),
        ("s3://b/a/..", ""),
        ("relative/dir/file.txt", "file.txt"),
        ("dir/", "dir"),
        ("a/..", ""),
        ("a/.", "a"),
        (".", ""),
        ("/", ""),
        ("", ""),
        ("weird name ü.json", "weird name ü.json"),
        ("x/%41.json", "%41.json"),
        ("https://h/ü/é.json", "%C3%A9.json"),
        ("HTTPS://H/A/B.JSON", "B.JSON"),
        ("  https://h/a.json  ", "a.json"),
        ("https://h/a%2e%2e/b", "b"),
        ("https://h/%2e%2E/z.json", "z.json"),
        ("mailto:a@b", "a@b"),
        ("1http://x/y", "y"),
        ("x:/a/./b/../c", "c"),
        ("http://h/a?b/c", "a"),
        ("https://h/a#b/c", "a"),
    ],
)
def test_extra_file_names_follow_url_then_path_rules(path: str, name: str) -> None:
    assert file_basename(path) == name


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("http:foo", ""),
        ("http:/foo", ""),
        ("http:foo/bar", "bar"),
        ("https:///x.json", ""),
        ("https:////x.json", ""),
        ("file:foo/bar", "bar"),
        ("file:/a", "a"),
        ("file:///C:/x/y.json", "y.json"),
        ("http://h:99999/a.json", "a.json"),
        ("http://user:pw@h/a.json", "a.json"),
        ("http://h/a%2Fb", "a%2Fb"),
        ("http://h/tab\there.json", "tabhere.json"),
        ("data:text/plain,hi", "plain,hi"),
        ("nonspecial://h/a\\b.json", "a\\b.json"),
        ("http://h/a\\..\\b.json", "b.json"),
    ],
)
def test_special_schemes_authority_and_whitespace_rules(path: str, name: str) -> None:
    assert file_basename(path) == name


@pytest.mark.parametrize(
    ("path", "name"),
    [
        # Strings the URL parser refuses are file paths, query and all.
        ("https:?x", "https:?x"),
        ("https:/", "https:"),
        ("http://h:99999/a.json?x", "a.json?x"),
        ("https://a b/c.json?q", "c.json?q"),
        ("http://[zz]/z.json?q", "z.json?q"),
        ("http://1.2.3.4.5/x.json?q", "x.json?q"),
        ("http://999.1.1.1/x.json?q", "x.json?q"),
        ("http://4294967296/x.json?q", "x.json?q"),
        ("file://a b/x.json?q", "x.json?q"),
        # ...and hosts it accepts keep the URL reading.
        ("http://4294967295/x.json?q", "x.json"),
        ("http://0x100/x.json?q", "x.json"),
        ("http://1.a/x.json?q", "x.json"),
        ("file://localhost/x.json?q", "x.json"),
    ],
)
def test_strings_that_are_not_urls_fall_back_to_path_rules(path: str, name: str) -> None:
    assert file_basename(path) == name
