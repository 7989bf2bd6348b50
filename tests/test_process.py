"""`import ooc` changes nothing process-wide; ooc.configure_process() and the CLIs do."""
import os
import subprocess
import sys


def _py(code: str, **env) -> str:
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_has_no_side_effects():
    assert _py("import os, ooc; print(os.environ.get('OMP_WAIT_POLICY'))") == "None"


def test_configure_process_sets_and_respects_the_environment():
    out = _py("import os, ooc; d = ooc.configure_process(); "
              "print(os.environ['OMP_WAIT_POLICY'], d['malloc_tuned'], d['torch_loaded'])")
    assert out == "PASSIVE True False"
    out = _py("import os, ooc; ooc.configure_process(); print(os.environ['OMP_WAIT_POLICY'])",
              OMP_WAIT_POLICY="ACTIVE")
    assert out == "ACTIVE"


def test_cli_applies_it():
    out = _py("import os, sys; from ooc.cli import main_wrapper\n"
              "@main_wrapper\ndef main(argv): print(os.environ.get('OMP_WAIT_POLICY'))\n"
              "main([])")
    assert out == "PASSIVE"
