"""pytest fixtures: a fresh daemon per test (see harness.py)."""

import pytest

from harness import SECRET, Daemon


@pytest.fixture
def make_daemon():
    started = []

    def make(config=None, args=(), setup=None):
        d = Daemon(config, args, setup)
        started.append(d)
        return d

    yield make
    failures = []
    for d in started:
        rc = d.stop()
        if rc != 0:
            failures.append("daemon exited %s after SIGTERM:\n%s" % (rc, d.log()))
        if SECRET in d.log():
            failures.append("the daemon's log contains the test secret")
        d.cleanup()
    assert not failures, "\n".join(failures)


@pytest.fixture
def daemon(make_daemon):
    return make_daemon()
