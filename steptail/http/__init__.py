"""`steptail serve`: read-only HTTP over the store (health, Prometheus metrics, JSON API, and
at `/` a live web page over that API: steptail/web, docs/page.md).

Health never waits behind work: /livez and /healthz answer from the event loop, /healthz with
the last result of a store probe that runs on a thread of its own. Store reads run in two
bounded lanes (Lane): exports in one, every other read in the other, each with a queue limit
beyond which a request is a 503 with a JSON body and `Retry-After` (eight exports of a big run
once held the default pool, and /healthz with it, for 15 s).
When a token is configured, everything but /healthz, /livez and the page's static files (`/`,
/static/…: nothing from the store) needs `Authorization: Bearer <token>`.
Every bad parameter is a 400 with a JSON body, every failure a JSON answer (no traceback); a
request path is logged escaped (a `%0a` in it cannot forge a log line).

Slow or idle clients cannot hold the server: a connection must send its request header within
`header_timeout` (also the keep-alive), a request body is read for at most `body_timeout`,
and at most `max_connections` are open (below the descriptor limit): at the cap a new
connection pushes out the oldest one that is not being answered.

The modules: server.py listens (connection cap, timeouts) and app.py holds the route table;
guard.py is the middleware (token, UTF-8 path, JSON errors), requests.py what a path and query
may hold, answers.py the JSON/ETag answers; lanes.py, probe.py, body_cache.py and metrics.py
the machinery; routes/ one module per route, the handler beside the store read it makes.
Nothing is imported here: `from steptail.http.server import serve`."""
