"""hive's own tests with holdfast's drop-ins in place of hive's classes (copied next to hive's
tests as conftest.py by test_hive_upstream.py; see NOTICE.md).

Before hive's test modules import them:
- ``framework.tracker.runtime_logger.RuntimeLogger`` becomes ``HoldfastRuntimeLogger`` (same
  constructor: the ``RuntimeLogStore`` hive's test gives is the one the drop-in links its runs
  into), a daemon per store (a fresh directory is a fresh log, as in hive);
- ``framework.credentials.EncryptedFileStorage`` becomes ``HoldfastCredentialStorage``, a
  daemon per directory hive's test names (a fresh directory is a fresh store, as in hive);
- hive's repository imports its package as ``core.framework``: aliases to the installed
  ``framework``.
Without pytest-asyncio, ``@pytest.mark.asyncio`` tests run under ``asyncio.run``.
"""

import asyncio
import inspect
import os
import sys

import pytest

sys.path.insert(0, os.environ["HOLDFAST_TESTS_DIR"])  # harness.py: the daemon under test

import framework  # noqa: E402
import framework.credentials  # noqa: E402
import framework.credentials.oauth2  # noqa: E402
import framework.credentials.storage  # noqa: E402
import framework.tracker.runtime_logger  # noqa: E402
from harness import Daemon  # noqa: E402
from holdfast_client.hive import (  # noqa: E402
    HoldfastCredentialStorage,
    HoldfastRuntimeLogger,
    close_shared_connections,
)

core = type(sys)("core")
core.__path__ = []
core.framework = framework
sys.modules.update({
    "core": core,
    "core.framework": framework,
    "core.framework.credentials": framework.credentials,
    "core.framework.credentials.oauth2": framework.credentials.oauth2,
    "core.framework.credentials.storage": framework.credentials.storage,
})

_daemons = {}  # key -> Daemon
_made = {"RuntimeLogger": 0, "EncryptedFileStorage": 0}  # drop-ins hive's tests made


def _daemon(key):
    if key not in _daemons:
        _daemons[key] = Daemon()
    return _daemons[key]


class RuntimeLogger(HoldfastRuntimeLogger):
    """hive's name and constructor, holdfast's logger: one daemon per store hive's test makes
    (hive's tests reuse run ids in fresh directories)."""

    def __init__(self, store, agent_id=""):
        where = ("runs", os.fspath(getattr(store, "_base_path", "")))
        _made["RuntimeLogger"] += 1
        super().__init__(store=store, agent_id=agent_id, socket_path=_daemon(where).socket)


class EncryptedFileStorage(HoldfastCredentialStorage):
    """hive's name and constructor, holdfast's storage: one daemon per directory."""

    def __init__(self, base_path=None, encryption_key=None, key_env_var="HIVE_CREDENTIAL_KEY"):
        _made["EncryptedFileStorage"] += 1
        super().__init__(socket_path=_daemon(("store", os.fspath(base_path))).socket)


framework.tracker.runtime_logger.RuntimeLogger = RuntimeLogger
framework.credentials.EncryptedFileStorage = EncryptedFileStorage
framework.credentials.storage.EncryptedFileStorage = EncryptedFileStorage


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if "pytest_asyncio" in sys.modules or not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


def pytest_configure(config):
    config.addinivalue_line("markers", "asyncio: run under asyncio.run")


def pytest_unconfigure(config):
    print("\nholdfast drop-ins made by hive's tests: %d RuntimeLogger, %d EncryptedFileStorage; "
          "%d daemons" % (_made["RuntimeLogger"], _made["EncryptedFileStorage"], len(_daemons)))
    close_shared_connections()
    for d in _daemons.values():
        d.stop()
        d.cleanup()
