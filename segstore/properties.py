"""Java-properties text (what Kafka's ``--config`` files and segstore's topic configs use):
parsing with comments, separators, backslash escapes and continuation lines, and escaping."""

from __future__ import annotations

import re

from .errors import InvalidConfigError

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f",
            "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!", " ": "\\ "}
_LINE = re.compile(r"((?:[^\\=: \t\f]|\\.)*)[ \t\f]*[=:]?[ \t\f]*(.*)\Z", re.S)


def format_value(value) -> str:
    """A config value as properties text (booleans lower case, lists comma-separated)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return repr(value) if isinstance(value, float) else str(value)


def escape(text: str) -> str:
    """Escape a key or value for a properties line."""
    return "".join(_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ch == "\x7f"
                                        else ch) for ch in text)


def _unescape(text: str) -> str:
    def one(m: re.Match) -> str:
        code = m.group(1)
        if code[0] == "u" and not re.fullmatch(r"u[0-9a-fA-F]{4}", code):
            raise InvalidConfigError(f"Malformed \\uxxxx encoding in properties text: {text!r}")
        return chr(int(code[1:], 16)) if code[0] == "u" else \
            {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(code, code)
    out = re.sub(r"\\(u.{0,4}|.)", one, text, flags=re.S)
    return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")  # \ud83d\ude00


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java-properties text into strings: ``#``/``!`` comments, ``=``/``:``/blank
    separators, backslash escapes and continuation lines; a repeated key keeps its last value."""
    lines, out, i = re.split(r"\r\n|\r|\n", text), {}, 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while (len(line) - len(line.rstrip("\\"))) % 2:  # odd trailing backslashes: continued
            line = line[:-1] + (lines[i].lstrip(" \t\f") if i < len(lines) else "")
            i += 1
        key, value = _LINE.match(line).groups()
        out[_unescape(key)] = _unescape(value)
    return out
