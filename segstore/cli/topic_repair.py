"""``segstore topics --repair``: rewrite a damaged topic metadata file from what the operator
states, so the store opens for writing again.

Nothing is guessed: the partition count decides where keyed records go and
``cleanup.policy`` whether retention deletes, so both must be given. The damaged file is kept
beside the new one as ``<topic>.json.damaged``.
"""

from __future__ import annotations

import os
import shutil

from ..config import StoreConfig, TopicConfig
from ..errors import StoreLockedError
from ..file_lock import FileLock
from ..topic import (discover_topics, meta_path, partition_dirs, validate_partition_count,
                     validate_topic_name, write_topic_meta)
from ._common import CommandError, UsageError, check_store_dir, lock_holder, parse_key_values


def run_repair(args) -> int:
    """Write ``--topic``'s metadata file from ``--partitions`` and ``--config``, under the
    writer lock, when the file is damaged or missing (a healthy one is changed with
    ``configs --alter``)."""
    if not args.topic:
        raise UsageError("--repair needs --topic")
    if args.partitions is None:
        raise UsageError("--repair needs --partitions: the partition count decides which "
                         "partition a key goes to, so it is not guessed from the directories")
    config = parse_key_values(args.config, "--config")
    if "cleanup.policy" not in config:
        raise UsageError("--repair needs --config cleanup.policy=...: the damaged file's "
                         "policy is unknown, and a default 'delete' would let retention "
                         "remove a compacted topic's data")
    topic = validate_topic_name(args.topic)
    partitions = validate_partition_count(args.partitions)
    store_config = StoreConfig.from_dict(parse_key_values(args.store_config, "--store-config"))
    cfg = TopicConfig.from_dict(config, defaults=store_config.topic_defaults())
    root = args.path
    check_store_dir(root)
    lock = FileLock(os.path.abspath(root))
    try:
        lock.acquire()  # no writer may open the store while its topics change
    except StoreLockedError:
        raise CommandError(f"{os.path.abspath(root)} is locked by another writer (pid "
                           f"{lock_holder(root)}); stop it first") from None
    try:
        path, hosted = _check_repairable(root, topic, partitions, store_config)
        if os.path.exists(path):
            shutil.copyfile(path, path + ".damaged")  # for whoever finds out what broke it
        write_topic_meta(root, topic, partitions, cfg, hosted=hosted)
    finally:
        lock.release()
    where = "" if hosted is None else f" (this store holds partitions {list(hosted)})"
    print(f"Rewrote {path}: topic {topic}, {partitions} partitions{where}, config "
          + ",".join(f"{k}={v}" for k, v in sorted(config.items())) + ".")
    return 0


def _check_repairable(root: str, topic: str, partitions: int, store_config: StoreConfig):
    """The topic's metadata file and the hosted list to write (None: every partition), or
    CommandError when the file is sound, the topic unknown or ``partitions`` too few for
    its directories."""
    defaults = store_config.topic_defaults()
    topics, damaged = discover_topics(
        root, lambda overrides: TopicConfig.from_dict(overrides, defaults=defaults))
    path = meta_path(root, topic)
    if topic not in damaged:
        if os.path.exists(path):
            raise CommandError(f"{path} is not damaged; change the topic's config with "
                               "'segstore configs --alter'")
        if topic not in topics:
            raise CommandError(f"no topic {topic!r} in {root}; create one with "
                               "'segstore topics --create'")
    numbers = partition_dirs(root).get(topic, set())
    if numbers and max(numbers) >= partitions:
        raise CommandError(f"{root} holds partition {topic}-{max(numbers)}: --partitions must "
                           f"be at least {max(numbers) + 1}")
    # A Kafka broker's log dir holds only some partitions of a topic; so may this one.
    hosted = None if len(numbers) in (0, partitions) else tuple(sorted(numbers))
    return path, hosted
