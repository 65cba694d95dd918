"""Producer id expiration (Kafka's ``producer.id.expiration.ms``, ProducerStateManager.
removeExpiredProducers / isProducerExpired): a producer without an open transaction whose last
batch or marker timestamp is ``producer.id.expiration.ms`` or more in the past is forgotten,
every ``producer.id.expiration.check.interval.ms`` (``LogStore.tick``) and when a log opens
(Kafka filters expired entries when it loads a snapshot). Time is the store's clock.

Expectations are Kafka's rule written out: expired iff no open transaction and
now - last timestamp >= expiration.
"""

from __future__ import annotations

import pytest

import segstore
from conftest import FakeClock
from segstore.errors import InvalidConfigError, InvalidRecordError
from segstore.records import ControlRecordType

T0 = 1_700_000_000_000
EXPIRE = 60_000
CHECK = 10_000


def open_store(root, clock, **extra):
    return segstore.open(root, clock=clock,
                         config={"producer.id.expiration.ms": EXPIRE,
                                 "producer.id.expiration.check.interval.ms": CHECK, **extra})


def idem(lg, pid, seq, epoch=0, **kw):
    return lg.append_batch([b"v"], producer_id=pid, producer_epoch=epoch, base_sequence=seq, **kw)


def test_tick_expires_idle_producers_but_not_open_transactions(tmp_path):
    clock = FakeClock(T0)
    s = open_store(str(tmp_path / "s"), clock)
    s.create_topic("t")
    lg = s.partition("t", 0)
    idem(lg, 1, 0)                                   # last timestamp T0
    idem(lg, 2, 0, is_transactional=True)            # open transaction: never expires
    clock.advance(EXPIRE // 2)
    idem(lg, 3, 0)                                   # last timestamp T0 + 30 s
    clock.advance(EXPIRE // 2 - 1)                   # T0 + 59.999 s: nothing is due yet
    s.tick()
    assert sorted(lg.active_producers()) == [1, 2, 3]
    clock.advance(1)                                 # T0 + 60 s: producer 1 is due, but
    s.tick()                                         # the last check was 1 ms ago
    assert sorted(lg.active_producers()) == [1, 2, 3]
    clock.advance(CHECK)
    s.tick()
    assert sorted(lg.active_producers()) == [2, 3]
    clock.advance(EXPIRE)
    s.tick()
    assert sorted(lg.active_producers()) == [2]
    assert lg.last_stable_offset == 1                # producer 2's transaction still holds it
    lg.append_control(ControlRecordType.COMMIT, producer_id=2, producer_epoch=0)
    clock.advance(EXPIRE)                            # the marker's timestamp counts from now
    s.tick()
    assert lg.active_producers() == {}
    s.close()


def test_checks_run_only_every_check_interval(tmp_path):
    clock = FakeClock(T0)
    s = open_store(str(tmp_path / "s"), clock)
    s.create_topic("t")
    lg = s.partition("t", 0)
    clock.advance(CHECK)
    s.tick()                                         # a check ran now (nothing to expire)
    idem(lg, 1, 0, timestamps_ms=[T0 + CHECK - EXPIRE])  # already due by its timestamp
    clock.advance(CHECK - 1)
    s.tick()
    assert 1 in lg.active_producers()                # the next check is not due yet
    clock.advance(1)
    s.tick()
    assert lg.active_producers() == {}
    s.close()


def test_an_expired_producer_starts_over_like_a_new_one(tmp_path):
    clock = FakeClock(T0)
    s = open_store(str(tmp_path / "s"), clock)
    s.create_topic("t")
    lg = s.partition("t", 0)
    idem(lg, 1, 0, epoch=5)
    with pytest.raises(InvalidRecordError, match="fenced"):
        idem(lg, 1, 1, epoch=4)
    clock.advance(EXPIRE + CHECK)
    s.tick()
    idem(lg, 1, 7, epoch=4)  # Kafka: an unknown producer may start at any sequence and epoch
    assert lg.active_producers()[1][1] == 4
    s.close()


@pytest.mark.parametrize("clean", [True, False])
def test_opening_a_log_drops_expired_producers(tmp_path, clean):
    root = str(tmp_path / "s")
    clock = FakeClock(T0)
    with open_store(root, clock) as s:
        s.create_topic("t")
        lg = s.partition("t", 0)
        idem(lg, 1, 0)
        idem(lg, 2, 0, is_transactional=True)
        clock.advance(EXPIRE - 1)
        idem(lg, 3, 0)
    if not clean:
        import os
        os.unlink(os.path.join(root, ".kafka_cleanshutdown"))
    clock.advance(1)                                 # producer 1 is due, 3 is not
    with open_store(root, clock) as s:
        assert sorted(s.partition("t", 0).active_producers()) == [2, 3]


@pytest.mark.parametrize("key", ["producer.id.expiration.ms",
                                 "producer.id.expiration.check.interval.ms"])
@pytest.mark.parametrize("value", [0, -1, "x", 2**31])
def test_bad_expiration_settings(tmp_path, key, value):
    with pytest.raises(InvalidConfigError, match=key):
        segstore.open(str(tmp_path / "s"), config={key: value})
