"""LuaScript (farm/store/lua.py) on a real redis-server: a script runs whatever the server's script cache holds."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from farm.store.lua import LuaScript
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

INCREMENT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def test_a_script_runs_when_the_cache_was_flushed_before_every_call(redis_server: RedisServer) -> None:
    client = redis_server.client()
    increment = LuaScript(client, INCREMENT)
    for expected in range(1, 6):
        client.script_flush()
        assert increment(["n"], [1]) == expected
    assert client.script_exists(increment.sha) == [True]


def test_a_script_runs_on_a_restarted_server_that_lost_its_cache(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(
        redis_server.url,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), 20, supported_errors=(redis.ConnectionError,)),
    )
    increment = LuaScript(client, INCREMENT)
    assert increment(["n"], [2]) == 2
    redis_server.restart()
    assert increment(["n"], [3]) == 5
    assert client.script_exists(increment.sha) == [True]


def test_redis_pys_own_script_object_fails_where_lua_script_does_not(redis_server: RedisServer) -> None:
    """The fault LuaScript exists for: redis-py's Script retries EVALSHA once after SCRIPT LOAD, so a cache emptied
    between the two (here by a flush that SCRIPT LOAD triggers, as a restart at that moment would) fails the call."""

    class FlushedAfterLoad(redis.Redis):
        def script_load(self, script: str) -> str:
            sha = super().script_load(script)
            super().script_flush()
            return sha

    client = FlushedAfterLoad.from_url(redis_server.url)
    own = client.register_script(INCREMENT)
    try:
        own(["n"], [1])
        raised = None
    except redis.exceptions.NoScriptError as error:
        raised = error
    assert raised is not None
    client.script_flush()
    assert LuaScript(client, INCREMENT)(["n"], [1]) == 1
