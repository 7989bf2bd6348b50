"""`import ooc` changes nothing process-wide; ooc.configure_process() and the CLIs do."""
import os
import subprocess
import sys


def _py(code: str, **env) -> str:
    e = {k: v for k, v in os.environ.items()
         if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_has_no_side_effects():
    assert _py("import os, ooc; print(os.environ.get('OMP_WAIT_POLICY'), "
               "os.environ.get('THP_MEM_ALLOC_ENABLE'))") == "None None"


def test_configure_process_sets_and_respects_the_environment():
    out = _py("import os, ooc; d = ooc.configure_process(); "
              "print(os.environ['OMP_WAIT_POLICY'], d['malloc_tuned'], d['torch_loaded'], "
              "os.environ['THP_MEM_ALLOC_ENABLE'])")
    assert out == "PASSIVE True False 1"
    out = _py("import os, ooc; ooc.configure_process(); "
              "print(os.environ['OMP_WAIT_POLICY'], os.environ['THP_MEM_ALLOC_ENABLE'])",
              OMP_WAIT_POLICY="ACTIVE", THP_MEM_ALLOC_ENABLE="0")
    assert out == "ACTIVE 0"


_HUGE_PAGE_ADVICE = """
import ooc, torch
{}
x = torch.empty(48 << 20, dtype=torch.uint8)
p, inside, flags = x.data_ptr(), False, ""
for line in open("/proc/self/smaps"):
    f = line.split()
    if "-" in f[0] and ":" not in f[0]:
        lo, hi = (int(v, 16) for v in f[0].split("-"))
        inside = lo <= p < hi
    elif inside and f[0] == "VmFlags:":
        flags = f[1:]
print("hg" in flags)
"""


def test_large_tensors_get_huge_page_advice_after_it():
    """torch's allocator honours the setting even with torch imported first (it reads it
    at its first allocation of 2 MiB or more): a large tensor's mapping carries
    ``madvise(MADV_HUGEPAGE)`` (``hg`` in its smaps flags), without the setting not."""
    assert _py(_HUGE_PAGE_ADVICE.format("ooc.configure_process()")) == "True"
    assert _py(_HUGE_PAGE_ADVICE.format("pass")) == "False"


def test_cli_applies_it():
    out = _py("import os, sys; from ooc.cli import main_wrapper\n"
              "@main_wrapper\ndef main(argv): print(os.environ.get('OMP_WAIT_POLICY'))\n"
              "main([])")
    assert out == "PASSIVE"
