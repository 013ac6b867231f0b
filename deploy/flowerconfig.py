"""Flower's configuration file for the farm: /metrics behind Flower's login.

Flower answers /metrics (Prometheus text: every worker's name, task counts by task name and state, prefetch and
runtime figures) to anyone, whatever --basic-auth says: its documentation lists /metrics and /healthcheck as exempt
from authentication, and no option changes that. Flower runs this file (`--conf`, tornado's parse_config_file)
before it builds its web application from the route table `flower.urls.handlers`, so the /metrics route is given
here to a subclass of Flower's own handler that asks for the same login as every other page first (basic auth from
FLOWER_BASIC_AUTH: a scraper sends it, Prometheus's `basic_auth`). /healthcheck stays open: it answers "OK" and
names nothing.

Run Flower with it from the repository root as `celery -A tasks.app flower --conf=deploy/flowerconfig.py`;
docker-compose.yml mounts it at /etc/farm/flowerconfig.py. A Flower whose route table no longer has exactly one
/metrics route makes this file raise, so Flower fails to start rather than serve its metrics to anyone.

Every name defined here that matches a Flower option would set that option: none does, and none may.
"""

from flower import urls
from flower.views.monitor import Metrics
from tornado import web

METRICS_ROUTE = r"/metrics"


class MetricsBehindLogin(Metrics):
    """Flower's /metrics once Flower's own check of the request's login (`current_user`) has passed: a wrong or
    missing basic-auth login is answered 401, as Flower's API answers it."""

    @web.authenticated
    async def get(self) -> None:
        await super().get()


def _guard_metrics(handlers: list) -> None:
    """Give the route table's one /metrics route to MetricsBehindLogin, in place (flower.app took the same list
    object when it was imported); raise if there isn't exactly one."""
    found = [index for index, route in enumerate(handlers) if isinstance(route, tuple) and route[0] == METRICS_ROUTE]
    if len(found) != 1:
        raise RuntimeError(
            f"deploy/flowerconfig.py: Flower has {len(found)} {METRICS_ROUTE} routes, expected one; "
            "refusing to start with its metrics open to anyone"
        )
    handlers[found[0]] = (METRICS_ROUTE, MetricsBehindLogin, *handlers[found[0]][2:])


_guard_metrics(urls.handlers)
