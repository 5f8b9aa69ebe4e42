"""Fast unit tests of the card package: decoding, mdcsum, keys and the discovery boundary."""
