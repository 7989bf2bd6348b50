"""The benchmarks' datasets, made once and reused: a synthetic dataset keyed by its
generation spec in a cache folder (``$OOC_CACHE``, default ``~/.cache/ooc``).

:func:`synthetic` reuses a folder it made with the same spec (``bench_spec.json`` beside
``meta.json``), generates it again when the spec differs, uses a dataset it did not make as
it is, and never writes over a folder that is not a dataset."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ooc.executor.sizing.memcg import log

STAMP = "bench_spec.json"


def cache_root() -> Path:
    """The folder cached datasets live in: ``$OOC_CACHE`` or ``~/.cache/ooc``."""
    return Path(os.environ.get("OOC_CACHE", Path.home() / ".cache" / "ooc"))


def spec_key(spec: dict[str, Any]) -> str:
    """A short name for ``spec`` (a hash of its sorted JSON)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def default_path(spec: dict[str, Any], prefix: str = "bench") -> Path:
    """Where :func:`synthetic` keeps ``spec``'s dataset when no folder is given."""
    return cache_root() / f"{prefix}-{spec_key(spec)}"


def synthetic(spec: dict[str, Any], path: Path | None = None, prefix: str = "bench"
              ) -> Path | None:
    """The synthetic dataset of ``spec`` (``generate_synthetic``'s arguments) at ``path``
    (default :func:`default_path`): reused when made here with ``spec``, generated (again)
    when absent or made here with another spec. A dataset not made here is used as it is
    (``spec`` does not apply) and never overwritten; any other non-empty folder is refused
    (logged, None)."""
    import ooc
    from ooc.storage.ingest import generate_synthetic

    path = Path(path) if path is not None else default_path(spec, prefix)
    stamp = path / STAMP
    if path.exists() and not stamp.exists():
        if not (path / "meta.json").exists() and any(path.iterdir()):
            log(f"{path}: not an ooc dataset and not empty; not generating over it")
            return None
        if (path / "meta.json").exists():
            try:
                ooc.open_dataset(path)
            except ooc.OocError as e:
                log(f"{path}: {e}; not generating over a dataset this tool did not make")
                return None
            log(f"using {path} as it is (not made by this tool: the generation options do "
                f"not apply)")
            return path
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        try:
            ooc.open_dataset(path)
            log(f"reusing {path}")
            return path
        except ooc.OocError as e:
            log(f"{path} unusable ({e}); generating again")
    log(f"generating {path}: {spec}")
    t0 = time.perf_counter()
    generate_synthetic(path, **spec, overwrite=True, progress=False)
    stamp.write_text(json.dumps(spec))
    log(f"generated in {time.perf_counter() - t0:.0f}s")
    return path
