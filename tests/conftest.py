
# ---- simulated cluster fixtures (simcluster/) ----
try:
    from sim_fixtures import make_simcluster, simcluster  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.sim_fixtures import make_simcluster, simcluster  # noqa: F401

# ---- stores: fresh SQLite and fresh real PostgreSQL databases; the sample logs (tests/samples) ----
try:
    from store_fixtures import db_url, samples, store  # noqa: F401
except ImportError:
    from tests.store_fixtures import db_url, samples, store  # noqa: F401
