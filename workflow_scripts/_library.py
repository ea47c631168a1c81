"""Imported first by every script: the workflow always runs its own ``src/``.

Snakemake's script preamble *appends* its search paths to ``sys.path``, and an installed ``dpr_pipeline`` (another
checkout's editable install, an older wheel) sits in site-packages before them; so the checkout's ``src/`` is put
at the **front** of ``sys.path`` (moved there when it is already present further back), and a ``dpr_pipeline``
imported from elsewhere before this module ran is forgotten so that the next import takes the checkout's.
The job manifest records which file the package was imported from (``software.dpr_pipeline_file``).
"""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def put_first(path: str = SRC) -> None:
    """``path`` at ``sys.path[0]`` (every other occurrence removed); modules of ``dpr_pipeline`` loaded from
    anywhere else are dropped from ``sys.modules``."""
    sys.path[:] = [path] + [p for p in sys.path if Path(p or ".").resolve() != Path(path).resolve()]
    for name in [n for n in sys.modules if n == "dpr_pipeline" or n.startswith("dpr_pipeline.")]:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if not Path(origin).resolve().is_relative_to(Path(path).resolve()):
            del sys.modules[name]


put_first()
