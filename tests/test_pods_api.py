"""collector/cluster/pods_api.py: the pod calls built exactly as the client's CoreV1Api builds
them (method, URL with its query, headers), and an older client given its own CoreV1Api."""

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from steptail.collector.cluster.pods_api import PodsApi, pods_api

CALLS = [
    ("list_namespaced_pod", ("ns",), {"label_selector": "a=b", "limit": 500, "_continue": "tok"}),
    ("list_namespaced_pod", ("ns",), {"label_selector": "a=b", "resource_version": "7", "watch": True,
                                      "timeout_seconds": 5, "allow_watch_bookmarks": True}),
    ("read_namespaced_pod", ("p-0", "ns"), {}),
    ("read_namespaced_pod_log", ("p-0", "ns"), {"container": "jax-tpu", "tail_lines": 1, "timestamps": True}),
    ("read_namespaced_pod_log", ("p-0", "ns"), {"container": "c", "previous": True, "limit_bytes": 10,
                                                 "since_seconds": 3}),
]


def _sent(api, name, args, kw) -> list:
    sent = []

    def call_api(method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        sent.append((method, url, dict(header_params or {}), body, _request_timeout))
        raise RuntimeError("captured")

    api.api_client.call_api = call_api
    with pytest.raises(RuntimeError, match="captured"):
        getattr(api, name)(*args, _preload_content=False, _request_timeout=10, **kw)
    return sent


@pytest.mark.parametrize("name,args,kw", CALLS)
def test_each_call_is_sent_as_core_v1_api_sends_it(name, args, kw):
    config = Configuration(host="https://127.0.0.1:6443")  # auth: the simulator's tests (a token)
    ours = _sent(PodsApi(ApiClient(config)), name, args, kw)
    theirs = _sent(CoreV1Api(ApiClient(config)), name, args, kw)
    assert ours == theirs and len(ours) == 1
    assert ours[0][0] == "GET" and ours[0][4] == 10


def test_an_older_client_gets_its_own_core_v1_api():
    client = ApiClient(Configuration(host="https://127.0.0.1:6443"))
    assert type(pods_api(client)) is PodsApi

    class Older(ApiClient):  # before 37.x: no param_serialize, no legacy call options
        param_serialize = property(lambda self: (_ for _ in ()).throw(AttributeError("param_serialize")))

    assert type(pods_api(Older(Configuration(host="https://127.0.0.1:6443")))) is CoreV1Api
