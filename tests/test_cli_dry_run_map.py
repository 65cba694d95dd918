"""``segstore compact --dry-run`` on a dirty section with more distinct keys than the offset
map holds: it says where each round's map stops, and the real ``compact`` then stops there.

Oracles: the rounds a real ``compact`` of the same store reports (its ``--json`` stats), and a
model written here from Kafka's rule (REF §6.5): a map of ``floor(slots x load factor)`` keys
stops at the first record whose new key would not fit, and its round cleans up to that record.
"""

from __future__ import annotations

import json

import pytest

import segstore
from segstore.cli import main

TS = 1_700_000_000_000
NOW = TS + 10_000
BUFFER = 24 * 30             # 30 slots: 27 keys a round at load factor 0.9
KEYS_A, KEYS_B = 60, 7       # two keyed records a batch: "k<i % 60>" and "j<i % 7>"
BATCHES = 200


def run(capsys, *argv) -> tuple:
    """(exit status, stdout) of ``main(argv)``."""
    rc = main([str(a) for a in argv])
    out, _ = capsys.readouterr()
    return rc, out


@pytest.fixture
def store(tmp_path):
    """Compacted ``c-0``: 200 two-record batches, 67 distinct keys, segments of ~1000 bytes
    (the last, active one is never cleaned)."""
    root = tmp_path / "store"
    with segstore.open(str(root)) as st:
        st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 1000})
        lg = st.partition("c", 0)
        for i in range(BATCHES):
            lg.append_batch([b"v%d" % i, b"w%d" % i],
                            keys=[b"k%d" % (i % KEYS_A), b"j%d" % (i % KEYS_B)],
                            timestamps_ms=TS + i)
    return root


def model_keys(offset: int) -> bytes:
    i, second = divmod(offset, 2)
    return b"j%d" % (i % KEYS_B) if second else b"k%d" % (i % KEYS_A)


def model_round_ends(start: int, upper: int, capacity: int) -> list:
    """Each round maps keys from its start until the map holds ``capacity`` keys; it stops at
    the next keyed record, new key or not (Kafka checks the size before every put), and cleans
    up to that record (every record is keyed, so the map's latest offset is the one before)."""
    ends = []
    while True:
        seen = set()
        for offset in range(start, upper):
            if len(seen) >= capacity:
                ends.append(offset)
                break
            seen.add(model_keys(offset))
        else:
            ends.append(upper)
            return ends
        start = offset


def wanted_buffer(keys: int, threads: int) -> int:
    slots = 1
    while int(slots * 0.9) <= keys:
        slots += 1
    return slots * 24 * threads


def config(threads: int = 1, buffer: int = BUFFER) -> list:
    return ["--store-config", f"log.cleaner.dedupe.buffer.size={buffer}",
            "--store-config", f"log.cleaner.threads={threads}"]


@pytest.mark.parametrize("force", [False, True])
def test_the_dry_run_predicts_where_each_round_stops(capsys, store, force):
    flags = ["--force"] if force else []
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                  *config(), *flags)
    assert rc == 0
    [e] = json.loads(out)["partitions"]
    upper = e["first_uncleanable_offset"]
    assert e["would_clean"] and e["first_dirty_offset"] == 0 and upper < 2 * BATCHES
    ends = model_round_ends(0, upper, 27)
    assert len(ends) > 2
    assert e["map_full"] is True
    assert e["clean_end_offset"] == ends[0] < upper
    assert e["round_ends"] == ends
    assert e["later_rounds_if_still_due"] is (not force)
    assert (e["dirty_keys"], e["map_capacity"]) == (KEYS_A + KEYS_B, 27)
    assert e["dedupe_buffer_size"] == BUFFER
    assert e["wanted_dedupe_buffer_size"] == wanted_buffer(KEYS_A + KEYS_B, 1)

    rc, out = run(capsys, "compact", "--path", store, "--json", "--now-ms", NOW, *config(),
                  *flags)
    assert rc == 0
    rounds = [c["stats"] for c in json.loads(out)["cleaned"]]
    real = [(s["first_dirty_offset"], s["end_offset"]) for s in rounds]
    predicted = list(zip([0] + ends[:-1], ends))
    # With --force the run goes on until the map no longer fills; without, only while the
    # partition is still due after each round: a prefix of the predicted rounds.
    assert real == predicted if force else (real == predicted[:len(real)] and real)
    assert rounds[0]["map_full"] and rounds[0]["dirty_keys"] == e["dirty_keys"]
    assert rounds[0]["wanted_buffer_bytes"] == e["wanted_dedupe_buffer_size"]
    # The store agrees: the first round left one record a key below its end.
    with segstore.open(str(store), readonly=True) as st:
        keys = [r.key for r in st.partition("c", 0).iter_records(end_offset=ends[0])]
    assert len(keys) == len(set(keys))


def test_a_buffer_as_advised_cleans_in_one_round(capsys, store):
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                  *config())
    [e] = json.loads(out)["partitions"]
    advised = config(buffer=e["wanted_dedupe_buffer_size"])
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                  *advised)
    [f] = json.loads(out)["partitions"]
    upper = f["first_uncleanable_offset"]
    assert f["map_full"] is False and f["round_ends"] == [upper] == [f["clean_end_offset"]]
    assert f["later_rounds_if_still_due"] is False and f["dirty_keys"] == KEYS_A + KEYS_B
    rc, out = run(capsys, "compact", "--path", store, "--json", "--now-ms", NOW, *advised)
    [one] = json.loads(out)["cleaned"]
    assert (one["stats"]["end_offset"], one["stats"]["map_full"]) == (upper, False)


def test_the_advice_counts_every_cleaner_thread(capsys, store):
    # Two threads share the buffer: each map gets half, and the advice is for both.
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                  *config(threads=2, buffer=2 * BUFFER))
    [e] = json.loads(out)["partitions"]
    assert (e["map_capacity"], e["dedupe_buffer_size"]) == (27, 2 * BUFFER)
    assert e["wanted_dedupe_buffer_size"] == wanted_buffer(KEYS_A + KEYS_B, 2)
    assert e["clean_end_offset"] == model_round_ends(0, e["first_uncleanable_offset"], 27)[0]


def test_the_text_says_where_the_map_fills_up(capsys, store):
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--now-ms", NOW, *config())
    assert rc == 0
    rc, js = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                 *config())
    [e] = json.loads(js)["partitions"]
    ends, upper = e["round_ends"], e["first_uncleanable_offset"]
    lines = out.splitlines()
    assert lines[0].startswith(f"would clean c-0: dirty section [0, {upper}), ")
    assert lines[1:4] == [
        f"  the offset map fills up: the dirty section holds 67 distinct keys, one round's map "
        f"holds 27 (log.cleaner.dedupe.buffer.size 720); the first round cleans [0, {ends[0]})",
        f"  then rounds ending at {', '.join(map(str, ends[1:]))} while the partition is still "
        "due after each (its dirty ratio is recomputed); every round rewrites the log up to "
        "its end",
        f"  log.cleaner.dedupe.buffer.size={wanted_buffer(67, 1)} would clean it in one round"]
    assert lines[4] == "dry run: would clean 1 of 1 compacted partitions; nothing changed"
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--now-ms", NOW, "--force",
                  *config())
    assert f"  then rounds ending at {', '.join(map(str, ends[1:]))}; every round" in out


def test_no_map_lines_when_the_map_holds_the_dirty_section(capsys, store):
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--now-ms", NOW)
    assert [ln for ln in out.splitlines() if ln.startswith("  ")] == []
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW)
    [e] = json.loads(out)["partitions"]
    assert e["map_full"] is False and e["round_ends"] == [e["first_uncleanable_offset"]]


def test_a_skipped_partition_has_no_map_fields(capsys, store):
    rc, out = run(capsys, "compact", "--path", store, "--dry-run", "--json", "--now-ms", NOW,
                  "--store-config", "log.cleaner.min.cleanable.ratio=1", *config())
    [e] = json.loads(out)["partitions"]
    assert not e["would_clean"]
    assert all(e[k] is None for k in ("map_full", "clean_end_offset", "round_ends",
                                      "dirty_keys", "wanted_dedupe_buffer_size"))


def test_a_timestamp_strategy_map_is_previewed_at_its_own_size(capsys, tmp_path):
    # A KIP-280 strategy map keeps 32-byte entries: 720 bytes hold 22 slots, 19 keys a round.
    root = tmp_path / "ts"
    with segstore.open(str(root)) as st:
        st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 1000,
                                        "compaction.strategy": "timestamp"})
        lg = st.partition("c", 0)
        for i in range(BATCHES):
            lg.append_batch([b"v%d" % i, b"w%d" % i],
                            keys=[b"k%d" % (i % KEYS_A), b"j%d" % (i % KEYS_B)],
                            timestamps_ms=TS + i)
    rc, out = run(capsys, "compact", "--path", root, "--dry-run", "--json", "--now-ms", NOW,
                  "--force", *config())
    [e] = json.loads(out)["partitions"]
    assert e["map_capacity"] == 19
    assert e["round_ends"] == model_round_ends(0, e["first_uncleanable_offset"], 19)
    rc, out = run(capsys, "compact", "--path", root, "--json", "--now-ms", NOW, "--force",
                  *config())
    assert [c["stats"]["end_offset"] for c in json.loads(out)["cleaned"]] == e["round_ends"]
