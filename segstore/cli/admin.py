"""``segstore log-dirs``, ``configs`` and ``topics``: Kafka's admin tools over one store.

Output keeps the shapes of ``kafka-log-dirs.sh``, ``kafka-configs.sh`` and ``kafka-topics.sh``
(ECO §6.2) where they mean something for a single local store: broker 0, one log dir, no replicas.
"""

from __future__ import annotations

import os

from ..config import STORE_CONFIG_KEYS, TOPIC_CONFIG_KEYS, StoreConfig, TopicConfig
from ._common import (CommandError, UsageError, add_store_options, check_damaged, damage_status,
                      format_value, open_store, parse_key_values, print_json, topic_names)
from .topic_repair import run_repair


def register(subparsers) -> None:
    """Add the ``log-dirs``, ``configs`` and ``topics`` subcommands."""
    p = subparsers.add_parser(
        "log-dirs", help="partition sizes as kafka-log-dirs.sh's JSON",
        description="Print the store as kafka-log-dirs.sh --describe does: one JSON line with "
                    "broker 0 and one log dir (the store's root). Kafka's two status lines are "
                    "left out so the output is pure JSON.")
    add_store_options(p)
    p.add_argument("--describe", action="store_true", required=True,
                   help="REQUIRED (as in Kafka): describe the log dir")
    p.add_argument("--topic-list", default=None, metavar="T1,T2",
                   help="only these topics (comma-separated)")
    p.set_defaults(func=run_log_dirs)

    p = subparsers.add_parser(
        "configs", help="describe or alter topic configs (kafka-configs.sh)",
        description="Describe or change topic config overrides, with kafka-configs.sh's options "
                    "and output lines. Store-wide defaults shown as synonyms come from "
                    "--store-config (they are not stored on disk).")
    add_store_options(p)
    p.add_argument("--entity-type", default="topics", help="only 'topics' is supported")
    p.add_argument("--entity-name", "--topic", dest="entity_name", default=None, metavar="TOPIC",
                   help="the topic (--describe without it describes every topic)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="print the topic's configs")
    action.add_argument("--alter", action="store_true", help="change the topic's overrides")
    p.add_argument("--all", action="store_true",
                   help="with --describe: every key, not only the overrides")
    p.add_argument("--add-config", action="append", default=[], metavar="K1=V1,K2=[A,B]",
                   help="with --alter: overrides to set; bracket values that hold commas")
    p.add_argument("--delete-config", action="append", default=[], metavar="K1,K2",
                   help="with --alter: overrides to remove (back to the default)")
    p.set_defaults(func=run_configs)

    p = subparsers.add_parser(
        "topics", help="create, list, describe, delete or repair topics (kafka-topics.sh)",
        description="Create, list, describe or delete topics, with kafka-topics.sh's options; "
                    "--repair rewrites a topic's damaged metadata file (the writer refuses a "
                    "store with one) from the partition count and config you give.")
    add_store_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true", help="create --topic")
    action.add_argument("--list", action="store_true", help="print every topic name")
    action.add_argument("--describe", action="store_true",
                        help="partition count, overrides, per-partition offsets and sizes")
    action.add_argument("--delete", action="store_true", help="delete --topic and its data")
    action.add_argument("--repair", action="store_true",
                        help="rewrite --topic's damaged (or missing) metadata file from "
                             "--partitions and --config, which must include cleanup.policy; "
                             "needs the writer lock")
    p.add_argument("--topic", default=None, help="the topic (all topics for --describe)")
    p.add_argument("--partitions", type=int, default=None,
                   help="with --create (default 1) and --repair (required)")
    p.add_argument("--replication-factor", type=int, default=1,
                   help="with --create: must be 1 (one local copy per partition)")
    p.add_argument("--config", action="append", default=[], metavar="K=V",
                   help="with --create and --repair: a topic config override; repeatable")
    p.add_argument("--if-not-exists", action="store_true",
                   help="with --create: succeed if the topic exists")
    p.add_argument("--if-exists", action="store_true",
                   help="with --delete/--describe: succeed if the topic does not exist")
    p.add_argument("--json", action="store_true", help="JSON instead of Kafka's text lines")
    p.set_defaults(func=run_topics)


# -- log-dirs ---------------------------------------------------------------------------------

def log_dirs_json(store, topics=None) -> dict:
    """The store in kafka-log-dirs.sh's JSON shape (``version`` 1, broker 0, one log dir)."""
    partitions = []
    for t in topic_names(store, topics):
        for p in store.partitions_for(t):
            lg = store.partition(t, p)
            # No replicas and no future (moving) logs: the lag is always 0.
            partitions.append({"partition": f"{t}-{p}", "size": lg.size_bytes, "offsetLag": 0,
                               "isFuture": False})
    return {"version": 1, "brokers": [{"broker": 0, "logDirs": [
        {"logDir": store.path, "error": None, "partitions": partitions}]}]}


def run_log_dirs(args) -> int:
    """``segstore log-dirs --describe``."""
    topics = None if args.topic_list is None else [t for t in args.topic_list.split(",") if t]
    with open_store(args) as store:
        print_json(log_dirs_json(store, topics))
        return damage_status(store, topics)


# -- configs ----------------------------------------------------------------------------------

def _synonyms(name: str, overrides: dict, store_config: StoreConfig) -> list:
    """Kafka's synonym chain of a topic key: the topic override, store-wide settings of its
    broker names (``STATIC_BROKER_CONFIG``), then the first broker name with a default."""
    out = []
    if name in overrides:
        out.append(f"DYNAMIC_TOPIC_CONFIG:{name}={format_value(overrides[name])}")
    key = TOPIC_CONFIG_KEYS[name]
    # Broker names in Kafka's precedence: the key's own broker name, then unit synonyms
    # (log.roll.ms before log.roll.hours, ...), as config.py lists them.
    brokers = [k for k in STORE_CONFIG_KEYS.values() if k.topic_name == name]
    if key.kafka_name and key.kafka_name in STORE_CONFIG_KEYS and \
            STORE_CONFIG_KEYS[key.kafka_name] not in brokers:
        brokers.insert(0, STORE_CONFIG_KEYS[key.kafka_name])
    set_in_store = store_config.overrides
    for k in brokers:
        if k.name in set_in_store:
            out.append(f"STATIC_BROKER_CONFIG:{k.name}={format_value(set_in_store[k.name])}")
    default = next((k for k in brokers if k.default is not None), None)
    if default is not None:
        out.append(f"DEFAULT_CONFIG:{default.name}={format_value(default.default)}")
    return out


def describe_configs_lines(store, topic: str, all_keys: bool) -> list:
    """kafka-configs.sh --describe lines for one topic."""
    cfg = store.topic_config(topic)
    overrides = cfg.overrides
    lines = [f"{'All' if all_keys else 'Dynamic'} configs for topic {topic} are:"]
    names = sorted(cfg) if all_keys else sorted(overrides)
    for name in names:
        syn = ", ".join(_synonyms(name, overrides, store.config))
        lines.append(f"  {name}={format_value(cfg[name])} sensitive=false synonyms={{{syn}}}")
    return lines


def run_configs(args) -> int:
    """``segstore configs --describe`` or ``--alter``."""
    if args.entity_type not in ("topics", "topic"):
        raise UsageError(f"--entity-type {args.entity_type!r} is not supported; "
                         "segstore has only topic configs ('topics')")
    if args.describe:
        if args.add_config or args.delete_config:
            raise UsageError("--add-config and --delete-config need --alter")
        with open_store(args) as store:
            topics = [args.entity_name] if args.entity_name else store.list_topics()
            for t in topics:
                store.topic_config(t)  # an unknown topic fails before anything is printed
            for t in topics:
                print("\n".join(describe_configs_lines(store, t, args.all)))
            return damage_status(store, args.entity_name and [args.entity_name])
    if not args.entity_name:
        raise UsageError("--alter needs --entity-name (or --topic)")
    if args.all:
        raise UsageError("--all goes with --describe")
    add = parse_key_values(args.add_config, "--add-config")
    delete = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if not add and not delete:
        raise UsageError("--alter needs --add-config or --delete-config")
    with open_store(args, writable=True) as store:
        current = store.topic_config(args.entity_name).overrides
        missing = [k for k in delete if k not in current]
        if missing:
            # Kafka refuses to delete an override that is not set; so do we, naming it.
            raise CommandError(f"invalid config(s): {', '.join(missing)} "
                               f"(not set on topic {args.entity_name})")
        store.alter_topic_config(args.entity_name, set=add, delete=delete)
    print(f"Completed updating config for topic {args.entity_name}.")
    return 0


# -- topics -----------------------------------------------------------------------------------

def _topic_info(store, name: str) -> dict:
    d = store.describe_topic(name)
    return {"topic": name, "partitions": d["partitions"],
            "configs": {k: format_value(v) for k, v in sorted(d["config"].items())},
            "partition_info": d["partition_info"]}


def run_topics(args) -> int:
    """``segstore topics --create/--list/--describe/--delete``."""
    if args.create:
        return _create_topic(args)
    if args.repair:
        return run_repair(args)
    if args.delete:
        if not args.topic:
            raise UsageError("--delete needs --topic")
        with open_store(args, writable=True) as store:
            if args.topic not in store.list_topics():
                if args.if_exists:
                    return 0
                raise CommandError(f"topic {args.topic!r} does not exist in {store.path}")
            store.delete_topic(args.topic)
        print(f"Deleted topic {args.topic}.")
        return 0
    with open_store(args) as store:
        names = store.list_topics()
        if args.list:
            if args.json:
                print_json(names)
            else:
                for n in names:
                    print(n)
            return damage_status(store)
        if args.topic:
            check_damaged(store, [args.topic])  # before --if-exists: the topic is there
            if args.topic not in names:
                if args.if_exists:
                    return 0
                raise CommandError(f"topic {args.topic!r} does not exist in {store.path}")
            names = [args.topic]
        infos = [_topic_info(store, n) for n in names]
        status = damage_status(store, args.topic and [args.topic])
    if args.json:
        print_json(infos)
        return status
    for info in infos:
        configs = ",".join(f"{k}={v}" for k, v in info["configs"].items())
        print(f"Topic: {info['topic']}\tPartitionCount: {info['partitions']}\t"
              f"Configs: {configs}")
        for p in info["partition_info"]:
            print(f"\tTopic: {info['topic']}\tPartition: {p['partition']}\t"
                  f"LogStartOffset: {p['log_start_offset']}\tLogEndOffset: {p['log_end_offset']}\t"
                  f"Segments: {p['segments']}\tSize: {p['size_bytes']}")
    return status


def _create_topic(args) -> int:
    if not args.topic:
        raise UsageError("--create needs --topic")
    if args.replication_factor != 1:
        raise UsageError("--replication-factor must be 1: segstore keeps one local copy "
                         "of each partition")
    if args.partitions is None:
        args.partitions = 1
    if args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    config = parse_key_values(args.config, "--config")
    # Validate before the store is opened, so a bad --config never leaves a new, empty store.
    TopicConfig(config, defaults=StoreConfig(parse_key_values(args.store_config,
                                                              "--store-config")))
    created_dir = not os.path.exists(args.path)
    with open_store(args, writable=True, create=True) as store:
        if args.topic in store.list_topics():
            if args.if_not_exists:
                return 0
            raise CommandError(f"topic {args.topic!r} already exists in {store.path}")
        store.create_topic(args.topic, num_partitions=args.partitions, config=config)
    if created_dir:
        print(f"Created store {args.path}.")
    print(f"Created topic {args.topic}.")
    return 0
