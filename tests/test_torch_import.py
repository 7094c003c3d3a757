"""cfbn stays importable, and torch-free, without PyTorch: only cfbn.torch imports it."""
import os
import subprocess
import sys
from pathlib import Path

import cfbn

ROOT = str(Path(cfbn.__file__).resolve().parent.parent)


def _run(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_cfbn_does_not_import_torch():
    r = _run("import sys\n"
             "import cfbn, cfbn.layer, cfbn.fold, cfbn.distributed, cfbn.reference\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_cfbn_torch_without_torch_says_what_to_install():
    # sys.modules[name] = None makes `import name` fail as if it were absent.
    r = _run("import sys\n"
             "sys.modules['torch'] = None\n"
             "try:\n"
             "    import cfbn.torch\n"
             "except ImportError as e:\n"
             "    print('ImportError:', e)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ImportError: cfbn.torch needs PyTorch: pip install cfbn[torch]"
