"""Issue 31, item 2: `pip install --no-build-isolation --no-index .` works
offline (no index, the installed setuptools), and a libheapc.so copied into
the package before installing is the one the installed package loads."""
import os
import shutil
import subprocess
import sys

from conftest import BUILD, ROOT


def test_offline_pip_install_with_bundled_libheapc(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, f), src / f)
    (src / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "docs/python.md"), src / "docs/python.md")
    shutil.copytree(os.path.join(ROOT, "python"), src / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "libheapc.so"))
    shutil.copy(os.path.join(BUILD, "libheapc.so"), src / "python/heapd/libheapc.so")
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1")
    for k in ("PYTHONPATH", "HEAPC_LIB", "HEAPD_LIB"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-index", "--no-deps", "--target", str(target), "."],
                       cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, "the offline install failed (python3-pip and python3-setuptools " \
        "are installed by scripts/deps.sh):\n" + p.stdout + p.stderr
    assert (target / "heapd" / "__init__.py").exists()
    assert (target / "heapd" / "libheapc.so").exists(), "libheapc.so was not shipped"
    env["PYTHONPATH"] = str(target)
    p = subprocess.run([sys.executable, "-c", "import heapd; print(heapd.library_path); "
                        "print(heapd.__version__)"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    path, ver = p.stdout.split()
    assert path == str(target / "heapd" / "libheapc.so") and ver == "0.1.0"
