"""Distributed compaction (placeholder until the cleaner lands)."""


def compact(spark, path, topics=None, force=False):
    raise NotImplementedError
