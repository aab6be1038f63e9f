"""The daemon under test, shared by every test file.

Every test that needs a daemon starts its own: a private HOME / XDG_* tree in a temp dir,
``holdfast init`` (store "default"), ``holdfast daemon`` on ``$XDG_RUNTIME_DIR/holdfast/
holdfast.sock``, and SIGTERM at the end (which must exit 0). The binary is ``$HOLDFAST_BIN``,
else ``target/debug/holdfast`` (``plugins/run-tests.sh`` builds it).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The package from this checkout unless an installed one is asked for (run-tests.sh installs
# it into its venv with pip and sets HOLDFAST_TEST_INSTALLED=1, so the packaging is tested too).
if not os.environ.get("HOLDFAST_TEST_INSTALLED"):
    sys.path.insert(0, str(HERE.parent))

import holdfast_client as hc  # noqa: E402


REPO = HERE.parents[2]
BIN = os.environ.get("HOLDFAST_BIN") or str(REPO / "target" / "debug" / "holdfast")

# A fake secret that is easy to search for in messages.
SECRET = "sk-test-DO-NOT-LEAK-" + "7f3a9c" * 4


# ---------------------------------------------------------------------------------------------
# The daemon under test


def clean_env(home):
    """The caller's environment less anything pointing at real stores, keys or daemons, with
    HOME and XDG_* under ``home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOLDFAST_", "HIVE_"))
        and k not in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "RUST_LOG", "XDG_RUNTIME_DIR")
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_STATE_HOME=str(home / "state"),
        XDG_RUNTIME_DIR=str(home / "run"),
    )
    return env


class Daemon:
    """``holdfast init`` then ``holdfast daemon`` in a fresh temp HOME."""

    def __init__(self, config=None, args=(), setup=None):
        # mkdtemp (0700, short path): a socket path must fit in 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="hf-py-"))
        self.home = self.root / "home"
        (self.home / "run").mkdir(parents=True, mode=0o700)
        os.chmod(self.home / "run", 0o700)
        self.env = clean_env(self.home)
        self.socket = str(self.home / "run" / "holdfast" / "holdfast.sock")
        out = self.cli("init")
        assert out.returncode == 0, "holdfast init failed:\n%s" % out.stderr
        if config is not None:
            cfg_dir = self.home / "config" / "holdfast"
            cfg_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            (cfg_dir / "config.toml").write_text(config)
        if setup is not None:
            setup(self.home)  # files the daemon must find when it starts
        self.log_path = self.root / "daemon.log"
        self._args = tuple(args)
        self._log = open(self.log_path, "wb")
        self._start()

    def _start(self):
        self.proc = subprocess.Popen(
            [BIN, *self._args, "daemon"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        self._wait_ready()

    def restart(self):
        """What ``systemctl --user restart`` (or an upgrade) does: stop this daemon by its pid
        (SIGTERM; it must exit 0), then start a new one on the same data dir and socket."""
        rc = self.stop()
        assert rc == 0, "daemon exited %s after SIGTERM:\n%s" % (rc, self.log())
        self._log = open(self.log_path, "ab")
        self._start()

    def _wait_ready(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    "daemon exited with %s:\n%s" % (self.proc.returncode, self.log())
                )
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.05)
            finally:
                s.close()
        raise AssertionError("daemon did not listen within %ss:\n%s" % (timeout, self.log()))

    def key_file(self, store="default"):
        """The store's own key file: ``keys/<store>.<store id>.key``, named by the identity
        ``holdfast init`` made (``metadata/holdfast-store.json``)."""
        base = self.home / "state" / "holdfast" / "stores" / store
        ident = json.loads((base / "metadata" / "holdfast-store.json").read_text())
        return self.home / "config" / "holdfast" / "keys" / ("%s.%s.key" % (store, ident["id"]))

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def cli(self, *args, input=None):
        return subprocess.run(
            [BIN, *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def client(self, name="pytest", plugin=None, **kw):
        return hc.Client(self.socket, client=name, plugin=plugin, **kw)

    def stop(self):
        """SIGTERM; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc

    def cleanup(self):
        shutil.rmtree(self.root, ignore_errors=True)


def assert_no_secret(exc, secret=SECRET):
    shown = [
        str(exc),
        repr(exc),
        repr(exc.args),
        json.dumps(exc.data),
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    ]
    for s in shown:
        assert secret not in s, "secret leaked into an exception: %s" % s


def render(events):
    """What a UI shows of a RecoveringStream's events: text appended, cleared by
    stream_reset; each seq once, in order."""
    text, seqs = "", []
    for ev in events:
        seqs.append(ev.seq)
        if ev.type == "stream_reset":
            text = ""
        elif ev.type == "text":
            text += ev.text
    assert len(seqs) == len(set(seqs)), "an event rendered twice: %s" % seqs
    assert seqs == sorted(seqs), seqs
    return text


class Proxy:
    """A Unix-socket proxy between clients and the daemon, for what a real daemon does too
    fast to see: it records every message each way, per connection (``sent``: client to daemon,
    ``recv``: daemon to client), holds the daemon's messages ``hold(conn_index, msg)`` picks
    until ``release()``, and ``cut()`` drops every connection (the client sees the connection
    lost, as when the daemon restarts)."""

    def __init__(self, target):
        self.root = tempfile.mkdtemp(prefix="hf-px-")
        self.path = os.path.join(self.root, "proxy.sock")
        self.target = target
        self.cv = threading.Condition()
        self.conns = []
        self.hold = None
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(self.path)
        self._listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX)
            try:
                up.connect(self.target)
            except OSError:
                down.close()
                continue
            conn = {"up": up, "down": down, "sent": [], "recv": [], "held": [],
                    "lock": threading.Lock()}
            with self.cv:
                idx = len(self.conns)
                self.conns.append(conn)
                self.cv.notify_all()
            threading.Thread(target=self._pump, args=(idx, down, up, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(idx, up, down, "recv"), daemon=True).start()

    def _pump(self, idx, src, dst, kind):
        conn = self.conns[idx]
        try:
            for line in src.makefile("rb"):
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = None
                with self.cv:
                    held = (kind == "recv" and self.hold is not None and isinstance(msg, dict)
                            and self.hold(idx, msg))
                    if isinstance(msg, dict):
                        conn[kind].append(msg)
                    if held:
                        conn["held"].append(line)
                    self.cv.notify_all()
                if not held:
                    with conn["lock"]:
                        dst.sendall(line)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def messages(self, idx, kind):
        with self.cv:
            return list(self.conns[idx][kind]) if idx < len(self.conns) else []

    def wait(self, pred, what, timeout=30.0):
        """Wait until ``pred()`` holds (AssertionError naming ``what`` after ``timeout``)."""
        with self.cv:
            assert self.cv.wait_for(pred, timeout), "timed out waiting for " + what

    def release(self):
        """Send on what was held, and hold nothing more."""
        with self.cv:
            self.hold = None
            todo = [(c, c["held"]) for c in self.conns]
            for c in self.conns:
                c["held"] = []
        for c, lines in todo:
            with c["lock"]:
                for line in lines:
                    c["down"].sendall(line)

    def cut(self):
        with self.cv:
            conns = list(self.conns)
        for c in conns:
            for s in (c["up"], c["down"]):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.cut()
        self._listener.close()
        shutil.rmtree(self.root, ignore_errors=True)
