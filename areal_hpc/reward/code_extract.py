"""Finding the program in a model's response to a coding problem.

Models answer with prose around a fenced block; the program is the last fenced block tagged
python (python3, py), else the last untagged block, else the last block of any language. A text
without any fence is taken as the program itself (a file given to `areal-hpc reward code`).
"""

from __future__ import annotations

import re

# An opening fence at the start of a line (``` or longer, optionally indented), its info string,
# the body, and a closing fence of the same length.
_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,})[ \t]*(?P<lang>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py", "py3"}


def extract_code(text: str) -> str:
    """The program in a response (see the module docstring)."""
    blocks = [(_language(m.group("lang")), m.group("body")) for m in _FENCE.finditer(text)]
    if not blocks:
        return text
    python = [body for lang, body in blocks if lang in _PYTHON_TAGS]
    untagged = [body for lang, body in blocks if not lang]
    return (python or untagged or [body for _, body in blocks])[-1]


def _language(info: str) -> str:
    """The language tag of a fence's info string ("Python title=x" -> "python")."""
    words = info.split()
    return words[0].lower() if words else ""
