"""The admin token: what opens /admin/* on a gateway without an admin key (adr/0039), as Jupyter's token does.

`vstack up` draws a new one at every start and writes it to `state_dir/admin-token` (mode 0600, so only this
user reads it); the gateway then takes /admin/* from loopback clients that send it (`Authorization: Bearer`),
and `vstack` reads the file and sends it. A web page cannot read the file, another user on the machine cannot
either. The file goes when the gateway stops.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from stack.files import replace_file

FILE_NAME = "admin-token"


def token_path(state_dir: Path | str) -> Path:
    return Path(state_dir) / FILE_NAME


def issue(path: Path) -> str:
    """A fresh token, written to `path` (0600) before the gateway takes requests."""
    token = secrets.token_urlsafe(32)
    replace_file(path, token + "\n", mode=0o600)
    return token


def read(state_dir: Path | str | None) -> str | None:
    """The running gateway's token, or None (no gateway started here, or a file this user cannot read)."""
    if state_dir is None:
        return None
    try:
        return token_path(state_dir).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def matches(token: str | None, presented: str | None) -> bool:
    return token is not None and presented is not None and hmac.compare_digest(token.encode(), presented.encode())


def withdraw(path: Path, token: str) -> None:
    """At shutdown: remove the file if it still holds this gateway's token (a newer start may have replaced it)."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == token:
            path.unlink()


def for_url(url: str) -> bool:
    """The token is sent only to a gateway on this machine's loopback: never to another host."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
