"""tools/check_docs.py, the runner of the documentation's code blocks: what it
runs, skips and reports; and that the documentation refers to nothing outside
the repository.  (CI runs the runner over the real pages.)"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "tools" / "check_docs.py"
if not CHECKER.exists():   # a copy of tests/ alone, as the wheel checks make
    pytest.skip("tools/check_docs.py is not beside this copy of the tests",
                allow_module_level=True)

spec = importlib.util.spec_from_file_location("check_docs", CHECKER)
check_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_docs)

PAGE = '''# A page

```python
a = 2
```

Text, then a block that uses the first one's names:

```python
assert a * 3 == 6
```

<!-- check_docs: needs a_module_that_is_not_installed -->
```python
import a_module_that_is_not_installed
```

````md
```python
raise RuntimeError("inside a longer fence: an example of Markdown, not code")
```
````

```sh
exit 1
```
'''


def _run(tmp_path, text, *args):
    page = tmp_path / "page.md"
    page.write_text(text)
    return subprocess.run([sys.executable, str(CHECKER), str(page), *args],
                          capture_output=True, text=True, timeout=300)


def test_blocks_of_a_page_share_names_and_optional_ones_skip(tmp_path):
    r = _run(tmp_path, PAGE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 blocks: 2 ran, 1 skipped, 0 failed" in r.stdout
    assert "needs a_module_that_is_not_installed" in r.stdout


def test_a_required_module_that_is_missing_fails(tmp_path):
    r = _run(tmp_path, PAGE, "--require", "a_module_that_is_not_installed")
    assert r.returncode == 1
    assert "FAILED " in r.stdout


def test_a_failing_block_is_reported_with_its_line(tmp_path):
    r = _run(tmp_path, "# Page\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'wrong'\n```\n")
    assert r.returncode == 1
    assert re.search(r"FAILED +.*page\.md:8", r.stdout)
    assert "AssertionError: wrong" in r.stdout
    assert "2 blocks: 1 ran, 0 skipped, 1 failed" in r.stdout


def test_blocks_run_away_from_the_repository(tmp_path):
    # so that `import cfbn` is the installed package, not the source folder
    r = _run(tmp_path, "```python\nimport os\nassert not os.path.exists('setup.py')\n```\n")
    assert r.returncode == 0, r.stdout


def test_fences_nest_as_in_commonmark():
    found = check_docs.blocks(PAGE)
    assert [(info, needs) for _, info, _, needs in found] == [
        ("python", []), ("python", []), ("python", ["a_module_that_is_not_installed"]),
        ("md", []), ("sh", [])]


def test_every_page_has_its_python_blocks_found():
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    assert len(pages) > 5
    counts = {p.name: len(check_docs.python_blocks(p)) for p in pages}
    for name in ("README.md", "numpy.md", "torch.md", "distributed.md"):
        assert counts[name] >= 2, counts


def test_no_reference_points_outside_the_repository():
    # the specification and the contributors' habits are pages of docs/
    pattern = re.compile(r"\b(SPEC|STYLE)\.md\b")
    hits = []
    for folder in ("cfbn", "csrc", "tests", "docs", "benchmarks", "tools"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".rst", ".c", ".h", ".pyx", ".sh") and \
                    path.resolve() != Path(__file__).resolve():
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line):
                        hits.append("%s:%d" % (path.relative_to(ROOT), n))
    readme = (ROOT / "README.md").read_text()
    assert not pattern.search(readme)
    assert hits == []
