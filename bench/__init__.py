"""ooc's benchmarks: one package, one harness (:mod:`bench.harness`).

Run from the repository root (the package is not installed with ooc)::

    python -m bench                      # the list of benchmarks
    python -m bench NAME [flags]         # one benchmark; NAME --help for its flags
    python -m bench table REPORT.json    # the markdown table of a report

Every benchmark writes one JSON report through :func:`bench.harness.write_report`.
"""
