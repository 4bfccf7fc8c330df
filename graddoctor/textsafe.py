"""Text from the user's script (an exception's message, its traceback) made safe to show: no
terminal escape sequences (torch's ``UnpicklingError`` carries ANSI bold) and no other control
characters, which a terminal would act on and a file would show as ``[1m``."""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, bold, cursor moves (ESC [ ... m)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|\x1b[@-Z\\-_]"  # other two-character escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # CSI as one C1 character
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # any other control character (tab and newline stay)
)


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (``\\r\\n`` becomes
    ``\\n``; tab and newline stay)."""
    return _ESCAPES.sub("", text.replace("\r\n", "\n")) if text else text
