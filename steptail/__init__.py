"""steptail: per-step loss telemetry from JAX process 0 of TPU post-training JobSets."""

__version__ = "0.1.0"

# The Python API (steptail.api) loads on first use: `import steptail` stays cheap for the CLI.
_API_NAMES = ("CompareRefused", "Steptail", "UnknownRun")


def open(db: str | None = None):
    """Open a store for reading; its runs, steps, findings and comparisons come back as pandas
    DataFrames (see steptail.api). `with steptail.open(db) as st: st.steps(run)`."""
    from steptail.api import open as open_store

    return open_store(db)


def __getattr__(name: str):
    if name in _API_NAMES:
        from steptail import api

        return getattr(api, name)
    raise AttributeError(f"module 'steptail' has no attribute {name!r}")
