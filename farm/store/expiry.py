"""Expiries kept on the server's side: a time to live for every key a submitter writes.

A submitter's client sets a time to live on what it writes (a request, a flag, staged bytes), but a submitter is
not trusted to: a key written without one would live until Redis is full, and Redis's ACL can allow SET without
allowing SET without EX. So workers look now and then (farm.distributed.intake_steps.IntakeSteps.housekeep) for
such keys without a time to live and give them the one the docs promise.
"""

from __future__ import annotations

from typing import Any

SCAN_COUNT = 1000
"""Keys a SCAN step visits: a sweep of a million keys is a thousand round trips, none blocking Redis for long."""


def expire_untimed(client: Any, pattern: str, seconds: int) -> int:
    """Give every key matching `pattern` that has no time to live one of `seconds` (SCAN, then one pipeline of TTL
    and one of EXPIRE per step, so a busy server is never blocked); returns how many it gave one."""
    given, cursor = 0, 0
    while True:
        cursor, names = client.scan(cursor, match=pattern, count=SCAN_COUNT)
        if names:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.ttl(name)
            untimed = [name for name, ttl in zip(names, pipe.execute()) if ttl == -1]
            for name in untimed:
                pipe.expire(name, seconds, nx=True)
            pipe.execute()
            given += len(untimed)
        if not int(cursor):
            return given
