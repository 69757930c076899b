"""How to add an extra to the ng_otel this command runs from.

ng_otel is installed from a wheel or a checkout, not only from an index, so a bare
``pip install 'ng-otel[report]'`` may find nothing. pip records where a package came from
(``direct_url.json``, PEP 610); the hint names that wheel or folder when there is one.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

DISTRIBUTION = "ng-otel"


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` to this installation."""
    origin = _direct_url()
    url = origin.get("url") if isinstance(origin.get("url"), str) else None
    if url is None:
        return f"pip install '{DISTRIBUTION}[{extra}]'"
    dir_info = origin.get("dir_info")
    if isinstance(dir_info, dict) and dir_info.get("editable") is True and url.startswith("file://"):
        return f"pip install -e '{url.removeprefix('file://')}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}] @ {url}'"


def _direct_url() -> dict[str, Any]:
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        origin = json.loads(text) if text else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return {}
    return origin if isinstance(origin, dict) else {}
