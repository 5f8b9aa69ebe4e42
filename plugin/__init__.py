"""WorkerSet admission for the Dynamo LLM frontend.

Admits the first configuration a frontend observes for each WorkerSet, keeps it until its last
worker is gone, and reports incompatible cohorts, so rolling updates never mix configurations.
"""

from __future__ import annotations

from workerset_admission.card import mdcsum
from workerset_admission.errors import CardDecodeError

__all__ = ["CardDecodeError", "__version__", "mdcsum"]

__version__ = "0.1.0"
