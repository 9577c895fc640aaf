"""The CEL engine: the `common-expression-language` package's Rust extension, loaded without
the package's own command line. `import cel` also imports `cel.cli` (prompt_toolkit, typer,
rich): about 0.18 s of every steptail process's start, for nothing steptail uses. Loaded as
`cel.cel` from where the package lies; anything unexpected there falls back to `import cel`."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _extension() -> ModuleType | None:
    if "cel.cel" in sys.modules:
        return sys.modules["cel.cel"]
    spec = importlib.util.find_spec("cel")  # finds the package without running its __init__
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        for path in sorted(Path(folder).glob("cel.*")):
            if not any(path.name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES):
                continue
            loader = importlib.machinery.ExtensionFileLoader("cel.cel", str(path))
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader("cel.cel", loader))
            # registered as the import system would: the extension initialises once per process
            # (a second load panics), and a later `import cel` then takes this one
            sys.modules["cel.cel"] = module
            try:
                loader.exec_module(module)
            except BaseException:
                del sys.modules["cel.cel"]
                raise
            return module
    return None


def _load() -> ModuleType:
    try:
        module = _extension()
    except Exception:  # noqa: BLE001 - a layout this does not know: the package's own import
        module = None
    if module is None or not all(hasattr(module, n) for n in ("compile", "Context")):
        import cel as module
    return module


cel = _load()
