"""Kafka's ``Topic``: what a topic name and a partition count may be, and each topic's
metadata file (``.segstore/topics/<name>.json``: partition count and config overrides).

Names follow Kafka's rules exactly, which also keeps every partition directory inside the
store's root.
"""

from __future__ import annotations

import json
import os
import re
from collections import abc
from typing import Callable

from .checkpoint import write_atomic
from .errors import (CorruptMetadataError, InvalidConfigError, InvalidTopicError,
                     InvalidTopicMetadataConfigError)
from .records import TopicPartition

_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_LENGTH = 249
MAX_PARTITIONS = 2 ** 31 - 1  # partition ids are Java ints
META_DIR = ".segstore"
# A partition directory's name: <topic>-<partition number> (the number in canonical form is
# checked where it matters, "-01" is not partition 1).
PARTITION_DIR = re.compile(r"(.+)-([0-9]+)")
# In each partition directory of a topic that has a metadata file: it tells a lost metadata
# file from a Kafka log dir, whose partitions rightly open with the default config. Kafka's
# loader ignores files it does not know, as it ignores partition.metadata.
PARTITION_MARKER = "segstore.topic"


def validate_topic_name(name) -> str:
    """Kafka's topic name rules, so no name can reach outside the store's root."""
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is longer than {MAX_TOPIC_LENGTH} characters ({len(name)})")
    if not _LEGAL_TOPIC.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: it may contain only ASCII letters, digits, '.', "
            "'_' and '-'")
    return name


def is_legal_topic_name(name: str) -> bool:
    """Whether ``name`` passes :func:`validate_topic_name` (for names found on disk)."""
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return False
    return True


def validate_partition_count(num_partitions) -> int:
    """A topic's partition count: an int from 1 to MAX_PARTITIONS (not a bool)."""
    if not isinstance(num_partitions, int) or isinstance(num_partitions, bool) \
            or not 1 <= num_partitions <= MAX_PARTITIONS:
        raise InvalidTopicError(f"num_partitions must be an int from 1 to {MAX_PARTITIONS} "
                                f"(Kafka's int32 partition ids), got {num_partitions!r}")
    return num_partitions


def topic_meta_dir(root: str) -> str:
    """Where a store keeps its topics' metadata files."""
    return os.path.join(root, META_DIR, "topics")


def meta_path(root: str, topic: str) -> str:
    """A topic's metadata file."""
    return os.path.join(topic_meta_dir(root), topic + ".json")


def write_topic_meta(root: str, name: str, partitions: int, cfg, hosted=None) -> None:
    """Write a topic's metadata atomically (``cfg`` is its TopicConfig: only the overrides).
    ``hosted``: the partition numbers present, for a topic of a Kafka broker's log dir that
    holds only some of them (None: all ``partitions``)."""
    meta = {"name": name, "partitions": partitions,
            "config": {k: v if not isinstance(v, (list, tuple)) else ",".join(v)
                       for k, v in cfg.overrides.items()}}
    if hosted is not None:
        meta["hosted"] = sorted(hosted)
    write_atomic(meta_path(root, name), json.dumps(meta, indent=1, sort_keys=True))


def _read_meta(path: str) -> dict:
    def corrupt(why: str) -> CorruptMetadataError:
        return CorruptMetadataError(f"{path}: corrupt topic metadata ({why})", file=path,
                                    reason=why, topic=_topic_of(path))

    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except UnicodeDecodeError as e:
        raise corrupt(f"not UTF-8: {e.reason} at byte {e.start}") from None
    except ValueError as e:
        raise corrupt(f"not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise corrupt("not a JSON object")
    for field in ("name", "partitions"):
        if field not in meta:
            raise corrupt(f"no {field!r} field")
    name, partitions = meta["name"], meta["partitions"]
    if not isinstance(name, str) or not is_legal_topic_name(name):
        raise corrupt(f"'name' is {json.dumps(name)}, not a legal topic name")
    if name != _topic_of(path):
        # The file's name is the topic's (write_topic_meta); a file that claims another topic
        # would describe that topic's partitions with this file's config.
        raise corrupt(f"'name' is {json.dumps(name)}, but the file is named for topic "
                      f"{json.dumps(_topic_of(path))}")
    if not isinstance(partitions, int) or isinstance(partitions, bool) \
            or not 1 <= partitions <= MAX_PARTITIONS:
        raise corrupt(f"'partitions' is {json.dumps(partitions)}, not a partition count")
    config = meta.setdefault("config", {})
    if not isinstance(config, dict):
        raise corrupt(f"'config' is {json.dumps(config)}, not a JSON object")
    hosted = meta.setdefault("hosted", None)
    if hosted is not None:
        if (not isinstance(hosted, list) or not hosted
                or any(not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < partitions
                       for p in hosted) or len(set(hosted)) != len(hosted)):
            raise corrupt(f"'hosted' is {json.dumps(hosted)}, not a list of distinct partition "
                          f"numbers below {partitions}")
        meta["hosted"] = tuple(sorted(hosted))
    return meta


def _topic_of(path: str) -> str:
    """The topic a metadata file describes, by its name (``<topic>.json``)."""
    return os.path.basename(path)[:-len(".json")]


def fix_hint(path: str) -> str:
    """How an operator repairs a damaged or missing topic metadata file, for error messages."""
    topic = _topic_of(path)
    repair = (f"'segstore topics --repair --topic {topic} --partitions N --config "
              "cleanup.policy=...' and the topic's other overrides")
    if not os.path.exists(path):
        return (f"restore {path} from a backup (or from the store the partition directories "
                f"were copied from), or write it with {repair}")
    return (f"restore {path} from a backup, or rewrite it with {repair}; do not delete it: "
            "its partitions would then open with the default config, and delete retention "
            "could remove a compacted topic's data")


def damaged_topic_error(err: CorruptMetadataError) -> CorruptMetadataError:
    """The error a read-only store raises when a topic set aside for ``err`` is used: the
    same type, naming the file, what is wrong and the fix."""
    return type(err)(f"topic {err.topic!r} is set aside, its metadata is damaged: {err}; "
                     f"{fix_hint(err.file)}", file=err.file, reason=err.reason, topic=err.topic)


def writable_open_error(root: str, damaged: dict) -> CorruptMetadataError:
    """The error of a writable open of a store with damaged topics (``{name: error}``, from
    :func:`discover_topics`): a writer cannot set a topic aside safely (retention, the cleaner
    and the checkpoints would go on without it), nor guess its config."""
    first = damaged[min(damaged)]
    others = sorted(e.file for name, e in damaged.items() if name != first.topic)
    more = f" (also damaged: {', '.join(others)})" if others else ""
    return type(first)(
        f"{first}{more}; cannot open {root} for writing until it is repaired: "
        f"{fix_hint(first.file)}. Read-only opens and the commands that only read (verify, "
        "describe, topics --list/--describe) still work and read the other topics",
        file=first.file, reason=first.reason, topic=first.topic)


def discover_topics(root: str, make_config: Callable[[dict], object]) -> tuple[dict, dict]:
    """The topics of a store directory, ``{name: {"partitions", "config", "hosted"}}``: those
    with a metadata file, then those found only as ``<topic>-<n>`` directories (a Kafka
    broker's log dir), which get ``make_config({})``. A broker holds only the partitions it
    hosts, so for those ``hosted`` lists the numbers found and the partition count is one more
    than the highest (None: every partition is there). See :func:`hosted_partitions`.

    Returned with the damaged topics, ``{name: CorruptMetadataError}``: those whose metadata
    file cannot be read or holds config overrides ``make_config`` rejects (named by the file).
    Their partition directories are left out, never opened with a guessed config.
    """
    topics: dict = {}
    damaged: dict = {}

    def load(path: str) -> None:
        try:
            meta = _read_meta(path)
            try:
                cfg = make_config(meta["config"])
            except InvalidConfigError as e:
                raise InvalidTopicMetadataConfigError(
                    f"{path}: {e}", file=path, reason=f"invalid config overrides: {e}",
                    topic=_topic_of(path)) from None
        except CorruptMetadataError as e:
            damaged[_topic_of(path)] = e
            return
        topics[meta["name"]] = {"partitions": meta["partitions"], "config": cfg,
                                "hosted": meta["hosted"]}

    meta_dir = topic_meta_dir(root)
    names = sorted(os.listdir(meta_dir)) if os.path.isdir(meta_dir) else []
    for n in names:
        if n.endswith(".json"):
            load(os.path.join(meta_dir, n))
    for topic, numbers in partition_dirs(root).items():
        if topic not in topics and topic not in damaged and _marked(root, topic, numbers):
            path = meta_path(root, topic)
            if os.path.exists(path):
                load(path)  # a writer created the topic after the listing above
            else:
                damaged[topic] = _missing_meta_error(path, topic)
        if topic in damaged:
            continue
        meta = topics.get(topic)
        if meta is None:
            n = max(numbers) + 1
            topics[topic] = {"partitions": n, "config": make_config({}),
                             "hosted": None if len(numbers) == n else tuple(sorted(numbers))}
        elif meta["hosted"] is not None:
            # A broker's topic whose config was changed here: a partition the broker took on
            # since (its directory is here now) is opened too.
            hosted = set(meta["hosted"]) | {p for p in numbers if p < meta["partitions"]}
            meta["hosted"] = (None if len(hosted) == meta["partitions"]
                              else tuple(sorted(hosted)))
    return topics, damaged


def partition_dirs(root: str) -> dict:
    """``{topic: {partition numbers}}`` of the ``<topic>-<n>`` directories in ``root`` (legal
    topic names, numbers in canonical form)."""
    found: dict[str, set] = {}
    for name in os.listdir(root):
        m = PARTITION_DIR.fullmatch(name)
        if (m and os.path.isdir(os.path.join(root, name)) and is_legal_topic_name(m.group(1))
                and m.group(2) == str(int(m.group(2)))):
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return found


def _marked(root: str, topic: str, numbers) -> bool:
    """Whether one of a topic's partition directories holds segstore's marker."""
    return any(os.path.exists(os.path.join(root, f"{topic}-{p}", PARTITION_MARKER))
               for p in numbers)


def _missing_meta_error(path: str, topic: str) -> CorruptMetadataError:
    why = (f"missing: the partition directories of topic {topic!r} hold segstore's "
           f"{PARTITION_MARKER} marker, so their partition count and config were in this file")
    return CorruptMetadataError(f"{path}: topic metadata {why}", file=path, reason=why,
                                topic=topic)


def mark_partitions(root: str, topic: str, partitions) -> None:
    """Put the marker in each of ``partitions``' directories that exist and lack it (the
    topic has a metadata file). The marker's text is for people; only its presence counts."""
    for p in partitions:
        directory = os.path.join(root, f"{topic}-{p}")
        marker = os.path.join(directory, PARTITION_MARKER)
        if not os.path.isdir(directory) or os.path.exists(marker):
            continue
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            os.write(fd, (f"# segstore: a partition of topic {topic}, whose partition count "
                          f"and config are in the store's {META_DIR}/topics/{topic}.json\n"
                          f"topic={topic}\n").encode())
        finally:
            os.close(fd)


def hosted_partitions(meta: dict):
    """The partition numbers a topic (a :func:`discover_topics` entry) has in this store."""
    return range(meta["partitions"]) if meta["hosted"] is None else meta["hosted"]


def remove_topic_meta(root: str, name: str) -> None:
    """Delete a topic's metadata file, if it has one."""
    try:
        os.unlink(meta_path(root, name))
    except FileNotFoundError:
        pass


def topic_partitions(partitions) -> list:
    """``partitions`` as TopicPartitions; InvalidTopicError for anything else (a lone topic
    name, a non-iterable)."""
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, abc.Iterable):
        raise InvalidTopicError(f"partitions must be TopicPartition(topic, partition) pairs, "
                                f"not {partitions!r}")
    out = []
    for tp in partitions:
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise InvalidTopicError(f"partitions must be TopicPartition(topic, partition) "
                                    f"pairs, not {tp!r}")
        out.append(TopicPartition(*tp))
    return out
