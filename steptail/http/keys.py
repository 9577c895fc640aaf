"""The application's shared objects, by key: the store, the token, the lanes, the probe, the
body cache, the metrics registry and the connections being answered."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from steptail.http.body_cache import BodyCache
from steptail.storage.db import Store

STORE = web.AppKey("store", Store)
TOKEN = web.AppKey("token", object)
REGISTRY = web.AppKey("registry", CollectorRegistry)
PROBE = web.AppKey("probe", object)  # StoreProbe
EXPORTS = web.AppKey("exports", object)  # Lane
READS = web.AppKey("reads", object)  # Lane
CONNECTIONS = web.AppKey("connections", object)  # LaneConnections of the read lane
BODIES = web.AppKey("bodies", BodyCache)  # answers of a run's routes, by ETag
ANSWERING = web.AppKey("answering", set)  # connections whose request is being handled



