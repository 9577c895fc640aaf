"""The three core/v1 pod calls steptail makes (list or watch, read one, read its log) on the
kubernetes client's own ApiClient, without `kubernetes.client.CoreV1Api`: that generated class
annotates every core/v1 operation when it is imported, about 0.7 s of CPU and the largest part
of a follower's start (a replica restarting is that much later to take its runs back). Each
request is built and sent as the class's methods build and send it: the same parameters in the
same order, `param_serialize` with its auth setting, the client's legacy call options (errors
raised as ApiException, `_preload_content=False` answers the raw response). Those two methods
came with the client's 37.x generator; an older client (pyproject allows >=30) gets its own
CoreV1Api from `pods_api`, at the old cost."""

from __future__ import annotations

from typing import Any

# what the generated methods offer as Accept; the client picks the first JSON one
_ACCEPTS = ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "application/cbor"]
_WATCH_ACCEPTS = [*_ACCEPTS, "application/json;stream=watch", "application/vnd.kubernetes.protobuf;stream=watch",
                  "application/cbor-seq"]
_LOG_ACCEPTS = ["text/plain", *_ACCEPTS]


class PodsApi:
    """CoreV1Api's pod methods this project calls, with the same names and keywords."""

    def __init__(self, api_client) -> None:
        self.api_client = api_client

    def list_namespaced_pod(self, namespace: str, *, label_selector: str | None = None,
                            allow_watch_bookmarks: bool | None = None, _continue: str | None = None,
                            limit: int | None = None, resource_version: str | None = None,
                            timeout_seconds: int | None = None, watch: bool | None = None,
                            _preload_content: bool = True, _request_timeout: Any = None):
        """list or watch objects of kind Pod

        :return: V1PodList"""  # the watch reads the item type from this line, as from the client's
        query = _query((("allowWatchBookmarks", allow_watch_bookmarks), ("continue", _continue),
                        ("labelSelector", label_selector), ("limit", limit),
                        ("resourceVersion", resource_version), ("timeoutSeconds", timeout_seconds),
                        ("watch", watch)))
        return self._get("/api/v1/namespaces/{namespace}/pods", {"namespace": namespace}, query,
                         _WATCH_ACCEPTS, "V1PodList", _preload_content, _request_timeout)

    def read_namespaced_pod(self, name: str, namespace: str, *, _preload_content: bool = True,
                            _request_timeout: Any = None):
        return self._get("/api/v1/namespaces/{namespace}/pods/{name}", {"name": name, "namespace": namespace},
                         [], _ACCEPTS, "V1Pod", _preload_content, _request_timeout)

    def read_namespaced_pod_log(self, name: str, namespace: str, *, container: str | None = None,
                                limit_bytes: int | None = None, previous: bool | None = None,
                                since_seconds: int | None = None, tail_lines: int | None = None,
                                timestamps: bool | None = None, _preload_content: bool = True,
                                _request_timeout: Any = None):
        query = _query((("container", container), ("limitBytes", limit_bytes), ("previous", previous),
                        ("sinceSeconds", since_seconds), ("tailLines", tail_lines), ("timestamps", timestamps)))
        return self._get("/api/v1/namespaces/{namespace}/pods/{name}/log", {"name": name, "namespace": namespace},
                         query, _LOG_ACCEPTS, "str", _preload_content, _request_timeout)

    def _get(self, path: str, path_params: dict, query: list, accepts: list[str], returns: str,
             preload: bool, timeout: Any):
        client = self.api_client
        request = client.param_serialize(
            method="GET", resource_path=path, path_params=path_params, query_params=query,
            header_params={"Accept": client.select_header_accept(accepts)}, body=None, post_params=[],
            files={}, auth_settings=["BearerToken"], collection_formats={}, _host=None, _request_auth=None)
        return client._call_with_legacy_options(request, {"200": returns, "401": None}, None, preload, timeout, True)


def pods_api(api_client):
    """PodsApi where the client builds requests as 37.x does, else the client's CoreV1Api."""
    if hasattr(api_client, "param_serialize") and hasattr(api_client, "_call_with_legacy_options"):
        return PodsApi(api_client)
    from kubernetes.client import CoreV1Api  # an older client: its own class, same calls

    return CoreV1Api(api_client)


def _query(pairs) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in pairs if v is not None]
