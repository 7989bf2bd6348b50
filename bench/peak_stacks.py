"""Where a command's memory peaks: run a module's ``main`` in this process and record the main
thread's stack each time the RSS passes a threshold and its previous high.

    python -m bench peak_stacks ooc.train 2600 --data D --device cuda --memory-budget 4GiB

prints the last ``--keep`` stacks (newest last) with the time and RSS of each, after the
command returns. The RSS is sampled every 3 ms by a thread, so a high shorter than that can
be missed; the stack is the main thread's at the sample, so memory a worker thread allocates
shows the main thread's moment, not the worker's.
"""
from __future__ import annotations

import importlib
import sys
import threading
import time
import traceback

import psutil


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m bench peak_stacks [--keep K] MODULE THRESHOLD_MIB ARGS..."
    try:
        keep = 4
        if argv[:1] == ["--keep"]:
            keep, argv = int(argv[1]), argv[2:]
        module, threshold, args = argv[0], int(argv[1]) << 20, argv[2:]
        entry = importlib.import_module(module).main
    except (IndexError, ValueError):
        print(f"peak_stacks: {usage}", file=sys.stderr)
        return 2
    except (ImportError, AttributeError) as e:
        print(f"peak_stacks: {argv[0]}: no module with a main() ({e})", file=sys.stderr)
        return 2
    proc = psutil.Process()
    seen: list[tuple[float, int, str]] = []
    t0 = time.time()
    done = threading.Event()

    def watch() -> None:
        best = 0
        while not done.is_set():
            rss = proc.memory_info().rss
            if rss > threshold and rss > best + (4 << 20):
                best = rss
                frame = sys._current_frames().get(threading.main_thread().ident)
                stack = "".join(traceback.format_stack(frame)[-9:]) if frame else "?"
                seen.append((time.time() - t0, rss, stack))
            done.wait(0.003)

    threading.Thread(target=watch, daemon=True).start()
    rc = 0
    try:
        rc = entry(args) or 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        done.set()
    for t, rss, stack in seen[-keep:]:
        print(f"=== +{t:.2f} s  RSS {rss >> 20} MiB\n{stack}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
