"""python -m bench peak_stacks names the code that holds memory when the RSS peaks."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HOG = '''
import time
import numpy as np

def hog():
    x = np.ones(48 << 17)          # 48 MiB, touched
    time.sleep(0.2)
    return float(x[-1])

def main(argv):
    assert argv == ["--flag"]
    hog()
    return 3
'''


def test_the_stack_at_the_high_is_the_allocating_function(tmp_path):
    (tmp_path / "hogmod.py").write_text(HOG)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    base = subprocess.run([sys.executable, "-c", "import numpy, psutil; "
                           "print(psutil.Process().memory_info().rss >> 20)"],
                          capture_output=True, text=True, env=env, check=True)
    threshold = int(base.stdout) + 24
    p = subprocess.run([sys.executable, "-m", "bench", "peak_stacks", "--keep", "1", "hogmod",
                        str(threshold), "--flag"], capture_output=True, text=True, env=env, cwd=REPO)
    assert p.returncode == 3                      # the command's own exit code
    out = p.stdout
    assert out.count("=== +") == 1 and "in hog" in out
    rss = int(out.split("RSS ")[1].split(" MiB")[0])
    assert rss >= threshold


def test_bad_arguments_get_one_line_and_exit_2():
    for argv, needle in ((["nosuchmodule_xyz", "100"], "no module with a main()"),
                         (["ooc.train", "lots"], "usage:"), ([], "usage:")):
        p = subprocess.run([sys.executable, "-m", "bench", "peak_stacks", *argv],
                           capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 2 and p.stdout == ""
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr
