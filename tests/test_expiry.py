"""farm.store.expiry on a real redis-server: keys without a time to live get one, the others keep theirs."""

from __future__ import annotations

from farm.store.expiry import SCAN_COUNT, expire_untimed
from tests.services import RedisServer, redis_server_fixture  # noqa: F401


def test_only_the_matching_keys_without_a_time_to_live_get_one(redis_server: RedisServer) -> None:
    raw = redis_server.client()
    pipe = raw.pipeline(transaction=False)
    for index in range(SCAN_COUNT * 2 + 7):  # more than one SCAN step
        pipe.set(f"farm:request:{index}", "x")
    pipe.execute()
    raw.set("farm:request:timed", "x", ex=50)
    raw.set("elsewhere", "x")
    assert expire_untimed(raw, "farm:request:*", 3600) == SCAN_COUNT * 2 + 7
    assert 3590 < raw.ttl("farm:request:0") <= 3600 and 3590 < raw.ttl(f"farm:request:{SCAN_COUNT * 2}") <= 3600
    assert raw.ttl("farm:request:timed") <= 50 and raw.ttl("elsewhere") == -1
    assert expire_untimed(raw, "farm:request:*", 3600) == 0
