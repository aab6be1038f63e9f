"""Finding the daemon's socket, as the ``holdfast`` CLI finds it."""

from __future__ import annotations

import json
import os
import re
from typing import Optional


def _env_path(var: str) -> Optional[str]:
    v = os.environ.get(var)
    if v and os.path.isabs(v):
        return v
    return None


def _expand_home(p: str) -> str:
    if p == "~" or p.startswith("~/"):
        home = _env_path("HOME")
        if home:
            return os.path.join(home, p[2:]) if p != "~" else home
    return p


def _config_path() -> Optional[str]:
    explicit = os.environ.get("HOLDFAST_CONFIG")
    if explicit:
        return explicit
    cfg = _env_path("XDG_CONFIG_HOME")
    if cfg:
        return os.path.join(cfg, "holdfast", "config.toml")
    home = _env_path("HOME")
    if home:
        return os.path.join(home, ".config", "holdfast", "config.toml")
    return None


_TOP_SOCKET = re.compile(r"""^\s*socket\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(?:#.*)?$""")


def _socket_from_config(path: str) -> Optional[str]:
    """The top-level ``socket`` of the config file, or None (no file, or no such key)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return None
    try:
        import tomllib  # Python 3.11+

        value = tomllib.loads(raw.decode("utf-8")).get("socket")
    except ImportError:
        value = None
        for line in raw.decode("utf-8", "replace").splitlines():
            if line.lstrip().startswith("["):
                break  # top-level keys come before the first table
            m = _TOP_SOCKET.match(line)
            if m:
                value = m.group(1) if m.group(1) is not None else m.group(2)
                if m.group(1) is not None:
                    value = json.loads('"%s"' % value)
                break
    except Exception:  # a broken config: the daemon refuses it too; fall back to the default
        value = None
    if isinstance(value, str) and value:
        return _expand_home(value)
    return None


def default_socket_path() -> str:
    """The daemon's socket, found as the ``holdfast`` CLI finds it: ``$HOLDFAST_SOCKET``, then
    the config file's ``socket`` (``$HOLDFAST_CONFIG``, else
    ``$XDG_CONFIG_HOME/holdfast/config.toml``), then ``$XDG_RUNTIME_DIR/holdfast/holdfast.sock``,
    else ``/tmp/holdfast-$UID/holdfast.sock``."""
    explicit = os.environ.get("HOLDFAST_SOCKET")
    if explicit:
        return explicit
    cfg = _config_path()
    if cfg:
        s = _socket_from_config(cfg)
        if s:
            return s
    runtime = _env_path("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "holdfast", "holdfast.sock")
    return "/tmp/holdfast-%d/holdfast.sock" % os.geteuid()
