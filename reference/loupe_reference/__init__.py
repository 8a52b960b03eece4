"""loupe_reference: the PyTorch / transformers side of loupe's parity toolkit.

Importing this package forces Hugging Face libraries offline: the reference
must only ever read local files (a GGUF or a local checkpoint directory).
These variables are set here, before any module imports transformers.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__version__ = "0.1.0"

#: Format version of the JSON records this package writes (generate, teacher-force, goldens).
JSON_FORMAT_VERSION = 1


class InputError(Exception):
    """A user-facing error (bad file, bad arguments): reported on one line, exit code 2."""
