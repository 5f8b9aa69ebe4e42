"""The Dynamo 1.7 runtime's verdict on cards: run by the 1.7 environment's Python, not the suite's.

``python dynamo17_oracle.py <cards.jsonl>``: each input line is one card's JSON text as a JSON
string; each output line is ``{"checksum": <local_dir() name> | null, "error": <text> | null}``,
in the same order. It imports only the standard library and the runtime under test.
"""

from __future__ import annotations

import json
import sys

from dynamo._core import ModelDeploymentCard


def verdict(text: str) -> dict[str, str | None]:
    try:
        card = ModelDeploymentCard.from_json_str(text)
    except Exception as exc:  # the runtime raises plain exceptions for any refusal
        return {"checksum": None, "error": str(exc)[:300]}
    return {"checksum": str(card.local_dir()).rsplit("/", 1)[1], "error": None}


def main(path: str) -> None:
    with open(path, encoding="utf-8") as given:
        for line in given:
            if line.strip():
                sys.stdout.write(json.dumps(verdict(json.loads(line))) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
