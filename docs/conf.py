"""Sphinx configuration: pages in Markdown (MyST), the API reference from the
numpydoc docstrings.  Built with ``sphinx-build -W -b html docs build/docs``;
every Python block of the pages runs under ``python tools/check_docs.py``."""
import os
import sys
import warnings

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# The API reference imports cfbn: an installed (or editable) build is used
# where there is one; the source folder serves otherwise, for its version.
if ROOT not in sys.path:
    sys.path.append(ROOT)

import cfbn  # noqa: E402

project = "cfbn"
author = "the cfbn authors"
copyright = "the cfbn authors"
version = release = cfbn.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures/*.json"]
myst_heading_anchors = 3

# cfbn.torch subclasses torch.nn modules; the docs build needs no PyTorch.
autodoc_mock_imports = ["torch", "mpi4py", "cupy"]
# Under the mocked torch, cfbn.torch's version check finds no usable torch and
# says it falls back to its Python operators: true of the mock, and no news.
warnings.filterwarnings("ignore", message="cfbn.torch: the operator library",
                        category=RuntimeWarning)
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
numpydoc_xref_param_type = False

html_theme = "alabaster"
html_title = "cfbn %s" % release
html_static_path = []
html_theme_options = {"description": "Fused batch normalization for NumPy and PyTorch on CPUs",
                      "page_width": "1100px", "body_max_width": "none"}
