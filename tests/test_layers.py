"""tools/check_layers.py: the repository's includes and imports run down the layers, and the
checker does catch an arrow that runs up (a C++ include, a Python import, deferred or not)
and a circle inside one layer. Needs no TensorFlow: it reads files only.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "tools" / "check_layers.py"


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_layers", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_layers = _load_checker()


def _write(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_repository_runs_down_the_layers():
    result = subprocess.run([sys.executable, str(CHECKER), str(ROOT)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every C++ include and Python import runs downward" in result.stdout


# ---------------------------------------------------------------------------------------
# C++: cc/<folder>/ includes its own folder and those below it
# ---------------------------------------------------------------------------------------

def test_downward_includes_pass(tmp_path):
    _write(tmp_path, {
        "cc/core/x.h": '#include "cc/core/y.h"\n#include <vector>\n',
        "cc/core/y.h": "",
        "cc/device/z.cc": '#include "cc/core/x.h"\n#include "cc/rules/r.h"\n',
        "cc/rules/r.h": '#include "cc/spmd/s.h"\n',
        "cc/spmd/s.h": "",
    })
    assert check_layers.check_cc(tmp_path) == []


def test_an_upward_include_is_caught(tmp_path):
    _write(tmp_path, {"cc/core/x.h": '// core\n#include "cc/device/y.h"\n',
                      "cc/device/y.h": ""})
    assert check_layers.check_cc(tmp_path) == [
        "cc/core/x.h:2: cc/core/ includes cc/device/, a higher layer"]


def test_a_sibling_include_is_caught(tmp_path):
    _write(tmp_path, {"cc/eager/e.cc": '#include "cc/graph/g.h"\n', "cc/graph/g.h": ""})
    assert check_layers.check_cc(tmp_path) == [
        "cc/eager/e.cc:1: cc/eager/ includes cc/graph/, a sibling"]


def test_a_folder_in_no_layer_is_caught(tmp_path):
    _write(tmp_path, {"cc/misc/m.h": "", "cc/core/x.h": '#include "cc/misc/m.h"\n'})
    problems = check_layers.check_cc(tmp_path)
    assert "cc/core/x.h:1: includes cc/misc/, in no layer" in problems
    assert any(p.startswith("cc/misc/m.h: folder cc/misc/ is in no layer") for p in problems)


# ---------------------------------------------------------------------------------------
# Python: tf_dtensor/<module> imports its own layer and those below it, with no circle
# ---------------------------------------------------------------------------------------

def test_downward_imports_pass(tmp_path):
    _write(tmp_path, {
        "tf_dtensor/_errors.py": "",
        "tf_dtensor/layout.py": "from tf_dtensor._errors import LayoutError\n",
        "tf_dtensor/api.py": "from tf_dtensor import layout, _errors\nimport tf_dtensor.layout\n",
        "tf_dtensor/config.py": "from tf_dtensor import api\n",  # one layer, one way
        "tf_dtensor/placements.py": "from tf_dtensor import api, config\n",
    })
    assert check_layers.check_python(tmp_path) == []


@pytest.mark.parametrize("statement", [
    "from tf_dtensor import placements\n",
    "from tf_dtensor.placements import Shard\n",
    "import tf_dtensor.placements\n",
    "def f():\n    from tf_dtensor import placements  # deferred, still an arrow\n",
], ids=["from-package", "from-module", "import", "deferred"])
def test_an_upward_import_is_caught(tmp_path, statement):
    _write(tmp_path, {"tf_dtensor/layout.py": "import numpy\n" + statement,
                      "tf_dtensor/placements.py": ""})
    line = 3 if statement.startswith("def") else 2
    assert check_layers.check_python(tmp_path) == [
        f"tf_dtensor/layout.py:{line}: layout imports placements, a higher layer"]


def test_a_circle_in_one_layer_is_caught(tmp_path):
    _write(tmp_path, {"tf_dtensor/api.py": "from tf_dtensor import config\n",
                      "tf_dtensor/config.py": "def f():\n    from tf_dtensor import api\n"})
    assert check_layers.check_python(tmp_path) == [
        "tf_dtensor: import circle api -> config -> api"]


def test_a_module_in_no_layer_is_caught(tmp_path):
    _write(tmp_path, {"tf_dtensor/stray.py": ""})
    assert check_layers.check_python(tmp_path) == [
        "tf_dtensor/stray.py: module stray is in no layer (add it to PY_LAYERS and to "
        "README's table)"]


def test_main_fails_and_names_each_arrow(tmp_path, capsys):
    _write(tmp_path, {"cc/core/x.h": '#include "cc/device/y.h"\n', "cc/device/y.h": "",
                      "tf_dtensor/mesh.py": "from tf_dtensor import api\n",
                      "tf_dtensor/api.py": ""})
    assert check_layers.main(["check_layers.py", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "cc/core/x.h:1: cc/core/ includes cc/device/, a higher layer" in out
    assert "tf_dtensor/mesh.py:1: mesh imports api, a higher layer" in out
    assert "2 arrow(s) run up the layers" in out
