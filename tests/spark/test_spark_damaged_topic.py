"""Spark over a store one of whose topics has a damaged metadata file: the read-only store sets
that topic aside, and a read that would include it raises its error (the file, what is wrong,
the fix) instead of reading on without its records; reads of the other topics work."""

from __future__ import annotations

import json
import os

import pytest

import segstore


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("damaged") / "store")
    with segstore.open(root) as store:
        for t in ("good", "bad"):
            store.create_topic(t, 2)
            for p in range(2):
                store.partition(t, p).append_batch([b"%s-%d" % (t.encode(), p)])
    with open(os.path.join(root, ".segstore", "topics", "bad.json"), "w") as f:
        f.write("{not json")
    return root


def _read(spark, root, **options):
    reader = spark.read.format("segstore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(root).select("topic", "partition", "value")


def test_the_healthy_topic_reads(spark, store_dir):
    rows = _read(spark, store_dir, subscribe="good").collect()
    assert sorted((r.topic, r.partition, bytes(r.value)) for r in rows) == \
        [("good", 0, b"good-0"), ("good", 1, b"good-1")]


@pytest.mark.parametrize("options", [{"subscribe": "good,bad"}, {"subscribePattern": ".*"},
                                     {"assign": json.dumps({"bad": [0]})}])
def test_a_read_that_includes_the_damaged_topic_names_its_file(spark, store_dir, options):
    with pytest.raises(Exception, match=r"bad\.json.*corrupt topic metadata.*not JSON"):
        _read(spark, store_dir, **options).collect()


def test_a_pattern_that_misses_the_damaged_topic_reads(spark, store_dir):
    rows = _read(spark, store_dir, subscribePattern="go.*").collect()
    assert len(rows) == 2
