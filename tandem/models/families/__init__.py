"""One module per Hugging Face model family, each defining `FAMILY` (tandem/models/registry.py
finds them by listing this package); `_common.py` holds what they share."""
