"""Tandem: RL post-training of LLMs as gRPC services on megatron-core.

The installed distribution has one top-level package, `tandem`: the repository's `services/` and
`controller/` folders install as `tandem.services` and `tandem.controller` (pyproject.toml's
package-dir), and the code imports them by those names. In a source checkout (this file next to
pyproject.toml and those folders, e.g. PYTHONPATH=repo or an editable install) the same names
resolve to the folders through this package's search path, so `python -m services.actor` from the
repository root and `python -m tandem.services.actor` anywhere run the same modules.
"""
import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and \
        all(_os.path.isfile(_os.path.join(_ROOT, d, "__init__.py")) for d in ("services", "controller")):
    __path__.append(_ROOT)  # noqa: F821 (a package's __path__): tandem.services -> ROOT/services
