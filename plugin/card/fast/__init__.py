"""The card boundary's speed code: fast record paths, memos and caches, kept apart from the model.

Nothing outside this package imports it but :mod:`..boundary`, whose ``decode_model_record``
tries these paths before the serde-faithful :func:`..boundary.decode_whole_record`. This package
calls the general path's parts (envelope checks, card decoding, ``card_facts``, the
registration builder); they never call it. Every shortcut answers exactly as the whole-record
decode does, or declines (returns ``None``) and leaves the record to it. Each rests on one
assumption, and a differential test holds it to the general path:

* ``records.decode_plain_model``: a base card's record under a key needing no unescaping,
  spelled byte for byte as 1.6.1 writes it, is decided without a parsed key or envelope parse.
  Assumes the bytes around the card fix the envelope's parse. Held by
  ``tests/card/test_plain_model_path.py`` (generated cards: the general answer or ``None``).
* ``records.try_canonical``: the same for any model key (adapters included); the card text must
  still parse as one complete value, which every card path checks. Held by
  ``tests/card/test_boundary_paths.py`` (fast and whole-record decodes agree).
* ``records`` last card: the card text of the record before, compared in place, answers with
  that record's facts. Assumes facts depend on the card text and the facts key of the settings
  (tokenizer overrides, Dynamo line) only.
  Held by ``tests/card/test_plain_model_path.py`` and ``test_boundary_paths.py`` (each record
  decoded twice, the second from the cache).
* ``records.try_shared_card``: a record is cut into an envelope (card as ``null``) and card
  text; when the envelope is flat and its ``card_json`` occurs once, decoding the parts equals
  decoding the whole. Held by ``tests/card/test_boundary_paths.py``.
* ``card_cache``: card facts by exact card text and the settings they depend on (tokenizer
  overrides, Dynamo line; bounded by count and bytes).
  Assumes decoding is a pure function of text and settings; a card naming a router policy file
  is never cached, since 1.6.1 reads that file on every decode. Held by
  ``tests/card/test_boundary_paths.py`` and the cache bound test in ``test_boundary.py``.
* ``neighbour``: a card that differs from the last field-by-field decoded card inside one value
  is that card with the value decoded afresh, and keeps its facts when computing them never
  read the value. Held by ``tests/card/test_neighbour.py`` (respelled values and fleets against
  a fresh decode).
* ``field_memo``: a card field's value is decoded once per distinct spelling. Assumes a field's
  decoding depends on its text only; declines spacing, repeated keys, escapes, refusals.
  Held by ``tests/card/test_field_memo.py`` (memoized decoding against the whole text).
* ``memo``: pure memos of pure functions (projection fingerprint, model-type names, group keys,
  record heads), each answering what the function answers. Held by
  ``tests/card/test_fast_memo.py``.
"""

from __future__ import annotations

from workerset_admission.card.fast.records import (
    clear_caches,
    decode_plain_model,
    try_canonical,
    try_shared_card,
)

__all__ = ["clear_caches", "decode_plain_model", "try_canonical", "try_shared_card"]
