"""Generate docs/configuration.md from segstore/config.py, so the reference never drifts.

    .venv/bin/python tools/gen_config_docs.py           # rewrite docs/configuration.md
    .venv/bin/python tools/gen_config_docs.py --check   # exit 1 if the committed file is stale

Every key comes from ``segstore.config.describe_keys()``: its name, type, default, valid values,
its Kafka broker synonym and its doc string. The Kafka keys segstore rejects, and why, come from
the same module. tests/test_config_docs.py runs ``--check``'s comparison.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from segstore import config  # noqa: E402

OUTPUT = os.path.join(ROOT, "docs", "configuration.md")
LONG_MAX = 2**63 - 1
DOUBLE_MAX = 1.7976931348623157e308
_MS_UNITS = ((86_400_000, "day"), (3_600_000, "hour"), (60_000, "minute"), (1_000, "second"))
_BYTE_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))

HEADER = """\
# Configuration reference

<!-- Generated from segstore/config.py by tools/gen_config_docs.py: do not edit by hand.
     Rerun `.venv/bin/python tools/gen_config_docs.py` after changing config.py;
     tests/test_config_docs.py fails while this file is stale. -->

segstore uses Kafka's configuration names and defaults. **Topic keys** are Kafka's topic-level
names: pass them to `store.create_topic(name, config={...})`, change them with
`store.alter_topic_config()` or `segstore configs --alter --add-config`. **Store keys** are
Kafka's broker names: pass them to `segstore.open(path, config={...})` (or `--store-config` on
the command line). A store key named after a topic key (`log.segment.bytes` for `segment.bytes`)
sets that topic key's default for every topic of the store.

Values may be Python values or the strings Kafka's tools pass (`"1073741824"`, `"true"`,
`"compact,delete"`). Unknown keys, Kafka keys segstore does not implement (listed at the end),
out-of-range values and conflicting values raise `segstore.errors.InvalidConfigError`, which
names the key, the value and the rule.

Valid values use Kafka's notation: `[14,...]` is "at least 14", `[0,...,1]` "between 0 and 1",
`(0,...,1]` excludes 0.
"""


def _human_ms(v: int) -> str:
    for unit, name in _MS_UNITS:
        if v >= unit and v % unit == 0:
            n = v // unit
            return f"{n} {name}{'s' if n != 1 else ''}"
    return ""


def _human_bytes(v: int) -> str:
    for unit, name in _BYTE_UNITS:
        if v >= unit and v % unit == 0:
            return f"{v // unit} {name}"
    return ""


def format_default(key) -> str:
    """A default as the reference shows it, with a readable hint for times and sizes."""
    v = key.default
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return f"`{'true' if v else 'false'}`"
    if isinstance(v, tuple):
        return f"`{','.join(v)}`"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""` (empty)'
    if v == LONG_MAX:
        return f"`{v}` (Long.MAX_VALUE)"
    if isinstance(v, float) and v == DOUBLE_MAX:
        return "`1.7976931348623157E308` (Double.MAX_VALUE)"
    text = f"`{v}`"
    hint = ""
    if isinstance(v, int) and v > 0:
        if key.name.endswith(".ms"):
            hint = _human_ms(v)
        elif key.name.endswith((".bytes", ".size")):
            hint = _human_bytes(v)
    return f"{text} ({hint})" if hint else text


def format_valid(key) -> str:
    """The validator in Kafka's notation (``any`` without one)."""
    if key.validator is None:
        return "any"
    return f"`{key.validator}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole of docs/configuration.md."""
    out = [HEADER]
    topic = config.describe_keys("topic")
    store = config.describe_keys("store")
    out.append(f"## Topic keys ({len(topic)})\n")
    out.append("| Key | Type | Default | Valid values | Store-wide default from | Meaning |")
    out.append("|---|---|---|---|---|---|")
    for k in topic:
        broker = f"`{k.kafka_name}`" if k.kafka_name else "none (segstore extension)"
        out.append(f"| `{k.name}` | {k.type} | {format_default(k)} | {format_valid(k)} | "
                   f"{broker} | {_cell(k.doc)} |")
    out.append("")
    out.append(f"## Store keys ({len(store)})\n")
    out.append("Store keys marked with a topic key set that key's default for every topic; "
               "among unit synonyms the most precise one that is set wins (`log.roll.ms` over "
               "`log.roll.hours`, `log.retention.ms` over `log.retention.minutes` over "
               "`log.retention.hours`), as in Kafka.\n")
    out.append("| Key | Type | Default | Valid values | Default of topic key | Meaning |")
    out.append("|---|---|---|---|---|---|")
    for k in store:
        topic_key = f"`{k.topic_name}`" if k.topic_name else ""
        out.append(f"| `{k.name}` | {k.type} | {format_default(k)} | {format_valid(k)} | "
                   f"{topic_key} | {_cell(k.doc)} |")
    out.append("")
    out.append("## Kafka keys segstore rejects\n")
    out.append("These are valid in Kafka but mean nothing for a single local store; setting one "
               "raises `InvalidConfigError` with the reason below.\n")
    out.append("| Key | Scope | Why |")
    out.append("|---|---|---|")
    # config.py keeps these private; the drift test fails loudly if they are renamed.
    rejected = (("topic", config._TOPIC_UNSUPPORTED), ("store", config._STORE_UNSUPPORTED))
    for scope, table in rejected:
        for name in sorted(table):
            out.append(f"| `{name}` | {scope} | {_cell(table[name])} |")
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    """Write the file, or with ``--check`` report whether it is up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/configuration.md differs from what would be written")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        try:
            with open(OUTPUT, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{OUTPUT} is stale: run .venv/bin/python tools/gen_config_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(OUTPUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
