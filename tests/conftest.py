
# ---- simulated cluster fixtures (simcluster/) ----
from sim_fixtures import make_simcluster, simcluster  # noqa: F401

# ---- stores: fresh SQLite and fresh real PostgreSQL databases; the sample logs (tests/samples) ----
from store_fixtures import db_url, samples, store  # noqa: F401
