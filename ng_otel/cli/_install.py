"""How to add an extra to the ng_otel this command runs from.

ng_otel is installed from a wheel or a checkout, not only from an index, so a bare
``pip install 'ng-otel[report]'`` may find nothing. pip records where a package came from
(``direct_url.json``, PEP 610); the hint names that wheel or folder when there is one.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

DISTRIBUTION = "ng-otel"


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` to this installation: this interpreter's pip (the
    venv's, activated or not), and the wheel or checkout pip recorded, if any."""
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    origin = _direct_url()
    url = origin.get("url") if isinstance(origin.get("url"), str) else None
    if url is None:
        return f"{pip} {shlex.quote(f'{DISTRIBUTION}[{extra}]')}"
    dir_info = origin.get("dir_info")
    if isinstance(dir_info, dict) and dir_info.get("editable") is True and url.startswith("file:"):
        return f"{pip} -e {shlex.quote(f'{url2pathname(urlsplit(url).path)}[{extra}]')}"
    return f"{pip} {shlex.quote(f'{DISTRIBUTION}[{extra}] @ {url}')}"


def _direct_url() -> dict[str, Any]:
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        origin = json.loads(text) if text else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return {}
    return origin if isinstance(origin, dict) else {}
