"""The hive drop-ins against hive's own published code (aden-hive 1.0.12) and the real daemon.

Every comparison runs hive's own class and the drop-in side by side on the same work and
prints both figures. Without hive installed (run-tests.sh installs it into its venv; PyPI may
be unreachable) these tests say SKIPPED with the reason, and the rest of the suite runs.
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from harness import BIN, HERE, SECRET, hc

try:
    from cryptography.fernet import Fernet
    from framework.credentials.models import CredentialKey, CredentialObject
    from framework.credentials.storage import CredentialStorage, EncryptedFileStorage
    from framework.credentials.store import CredentialStore
    from framework.tracker.runtime_log_schemas import NodeDetail, NodeStepLog
    from framework.tracker.runtime_log_store import RuntimeLogStore
    from framework.tracker.runtime_logger import RuntimeLogger
    from pydantic import SecretStr

    from holdfast_client.hive import HoldfastCredentialStorage, HoldfastRuntimeLogger
except ImportError as e:  # the reason is printed by run-tests.sh too
    pytest.skip(
        "SKIPPED: hive (aden-hive 1.0.12) is not importable here: %s%s"
        % (e, " (" + os.environ["HOLDFAST_HIVE_MISSING"] + ")"
           if os.environ.get("HOLDFAST_HIVE_MISSING") else ""),
        allow_module_level=True,
    )


def cred(cid, value, **extra_keys):
    keys = {"api_key": CredentialKey(name="api_key", value=SecretStr(value))}
    for k, v in extra_keys.items():
        keys[k] = CredentialKey(name=k, value=SecretStr(v))
    return CredentialObject(id=cid, keys=keys, description="test " + cid)


def secrets_of(c):
    return {k: v.get_secret_value() for k, v in c.keys.items()}


def hive_store_umask_022(root, n=3):
    """A store made by hive itself the way a user's is: umask 022, hive's key file."""
    old = os.umask(0o022)
    try:
        home = Path(root) / ".hive"
        key_path = home / "secrets" / "credential_key"
        key_path.parent.mkdir(parents=True)
        key_path.parent.chmod(0o700)  # as hive's save_credential_key does
        key = Fernet.generate_key()
        key_path.write_bytes(key)
        key_path.chmod(0o600)
        storage = EncryptedFileStorage(home / "credentials", encryption_key=key)
        for i in range(n):
            storage.save(cred("svc/%d" % i, "sk-hive-%d" % i))
    finally:
        os.umask(old)
    return home / "credentials", key_path, key


def modes(base):
    return {str(p.relative_to(base)): p.stat().st_mode & 0o777
            for p in [base, *sorted(base.rglob("*"))]}


# ---------------------------------------------------------------------------------------------
# Credentials


def test_storage_is_hives_interface_with_hives_objects(daemon):
    storage = HoldfastCredentialStorage(socket_path=daemon.socket)
    assert isinstance(storage, CredentialStorage)
    store = CredentialStore(storage=storage)
    c = cred("google/work", SECRET, _integration_type="google", _alias="work",
             _identity_email="me@example.com", refresh_token="rt-" + SECRET)
    store.save_credential(c)
    store.save_credential(cred("google/home", "sk-home", _integration_type="google",
                               _alias="home"))
    store.save_credential(cred("brave", "sk-brave"))
    store.clear_cache()
    got = store.get_credential("google/work", refresh_if_needed=False)
    assert isinstance(got, CredentialObject)
    assert isinstance(got.keys["api_key"].value, SecretStr)
    assert secrets_of(got) == secrets_of(c)
    assert got.description == c.description and got.created_at == c.created_at
    assert got.provider_type == "google" and got.alias == "work"
    assert got.identity.email == "me@example.com"
    assert "holdfast_generation" not in got.model_dump()
    assert SECRET not in repr(got) and SECRET not in repr(storage)
    assert store.get("brave") == "sk-brave"
    assert sorted(store.list_credentials()) == ["brave", "google/home", "google/work"]
    # hive's CredentialStore uses these two when the storage has them (multi-account routing).
    accounts = store.list_accounts("google")
    assert sorted(a["alias"] for a in accounts) == ["home", "work"]
    assert store.get_credential_by_alias("google", "google/home").id == "google/home"
    assert store.get_credential_by_alias("google", "nope") is None
    assert storage.exists("brave") and not storage.exists("nope")
    assert storage.load("nope") is None
    assert store.delete_credential("brave") and not storage.delete("brave")
    # The daemon holds exactly this, readable by the CLI (through the daemon).
    out = daemon.cli("cred", "get", "google/work", "--field", "refresh_token")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rt-" + SECRET
    # hive's own EncryptedFileStorage reads the daemon's files with holdfast's key: they are
    # hive's format.
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default",
                                encryption_key=key)
    assert secrets_of(hive.load("google/work")) == secrets_of(c)
    storage.close()


def test_saved_times_and_listing_order_are_hives(daemon, tmp_path):
    """hive's storage keeps the updated_at its caller saved and lists ids in insertion order
    (an update keeps its place, a deleted and saved-again id goes last): the drop-in too."""
    from datetime import datetime, timedelta, timezone

    hive = EncryptedFileStorage(tmp_path / "hive", encryption_key=Fernet.generate_key())
    ours = HoldfastCredentialStorage(socket_path=daemon.socket)
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    made = {}

    def make(cid, minutes):
        c = cred(cid, "sk-" + cid)
        c.created_at = t0 + timedelta(minutes=minutes)
        c.updated_at = t0 + timedelta(minutes=minutes, seconds=30)
        made[cid] = c
        return c

    steps = [("save", make("zeta", 1)), ("save", make("alpha", 2)), ("save", make("mid", 3)),
             ("save", make("zeta", 1)), ("delete", "alpha"), ("save", make("alpha", 9)),
             ("save", make("beta", -5)), ("save", make("mid", 3))]
    for op, arg in steps:
        for storage in (hive, ours):
            if op == "save":
                storage.save(arg)
            else:
                storage.delete(arg)
    # zeta and mid updated in place, alpha deleted and made again, beta made (created_at)
    # before all of them but saved last: hive's order is its index's, the order of first saves.
    assert hive.list_all() == ["zeta", "mid", "alpha", "beta"], hive.list_all()
    assert ours.list_all() == hive.list_all()
    for cid in hive.list_all():
        h, o = hive.load(cid), ours.load(cid)
        assert o.updated_at == h.updated_at == made[cid].updated_at, (cid, o.updated_at)
        assert o.created_at == h.created_at
    # A document saved without keep (the plain client) is stamped by the daemon as before.
    c = hc.Client(daemon.socket)
    c.set({"id": "plain", "keys": {"api_key": {"value": "v"}},
           "updated_at": "2020-01-01T00:00:00Z"})
    assert not c.get("plain").credential["updated_at"].startswith("2020"), "stamped"
    c.close()
    ours.close()


def test_ids_as_long_as_hive_takes_go_both_ways(daemon, tmp_path):
    """hive's storage takes ids up to 251 bytes (`<id>.enc` is a 255-byte file name): the
    drop-in saves, reads, updates and deletes them, and hive reads what it wrote; one more
    byte is refused by both, nothing written."""
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default", encryption_key=key)
    ours = HoldfastCredentialStorage(socket_path=daemon.socket)
    ids = ["a" * 251, "team/" + "b" * 246, "é" * 125 + "x"]
    for cid in ids:
        assert len(cid.encode()) == 251
        ours.save(cred(cid, "sk-1"))
        ours.save(cred(cid, "sk-2"))
        assert secrets_of(hive.load(cid)) == {"api_key": "sk-2"}
        assert secrets_of(ours.load(cid)) == {"api_key": "sk-2"}
    c = hc.Client(daemon.socket)
    assert [c.get(cid).generation for cid in ids] == [2, 2, 2]
    assert ours.delete(ids[0]) and ours.load(ids[0]) is None
    ours.save(cred(ids[0], "sk-3"))
    assert c.get(ids[0]).generation == 3, "made again above the generation it reached"
    with pytest.raises(hc.InvalidParams):
        ours.save(cred("c" * 252, "sk"))
    with pytest.raises(OSError):  # hive's own: the file name is too long
        hive.save(cred("c" * 252, "sk"))
    names = sorted(os.listdir(daemon.home / "state/holdfast/stores/default/credentials"))
    assert all(len(n.encode()) <= 255 for n in names), names
    assert sorted(ours.list_all()) == sorted(ids)
    c.close()
    ours.close()


def test_a_store_the_daemon_does_not_serve_is_an_error_naming_it_not_no_credential(daemon):
    """A typo in the store name, or hive's store imported without a restart: load used to
    answer None ("no credential") while exists raised; now both say the store is not served."""
    storage = HoldfastCredentialStorage("hive", socket_path=daemon.socket)
    with pytest.raises(hc.StoreNotServed) as ei:
        storage.load("svc/1")
    e = ei.value
    assert (e.kind, e.store) == ("not_found", "hive")
    msg = str(e)
    assert "'hive'" in msg and "'svc/1'" in msg, msg
    assert "restart" in msg and "holdfast import --from-hive" in msg, msg
    assert "stores: default" in msg, "the daemon's own list of the stores it serves: " + msg
    assert isinstance(e, hc.NotFound)  # still a not_found for code that sorts by kind
    # hive's CredentialStore passes it on instead of reading "no credential".
    with pytest.raises(hc.StoreNotServed):
        CredentialStore(storage=storage).get_credential("svc/1", refresh_if_needed=False)
    # Every other call of hive's interface says the same, naming the store.
    for call in (lambda: storage.exists("svc/1"), lambda: storage.delete("svc/1"),
                 storage.list_all, lambda: storage.save(cred("svc/1", "v"))):
        with pytest.raises(hc.StoreNotServed) as ei:
            call()
        assert ei.value.store == "hive" and "restart" in str(ei.value), ei.value
    storage.close()
    # A store that is served still reads a missing credential as None.
    served = HoldfastCredentialStorage(socket_path=daemon.socket)
    assert served.load("nope") is None
    served.close()


def test_hive_saving_an_old_copy_never_moves_a_generation_back(daemon):
    """hive keeps unknown fields, so a hive process that loaded a credential before holdfast
    wrote it again saves its old copy back with the old ``holdfast_generation`` inside. The
    generation holdfast reports must still go forward, and a compare-and-swap by a client that
    read before hive's save must be refused (issue 34; docs/design.md "Generations")."""
    from holdfast_client import Conflict

    c = daemon.client()
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default",
                                encryption_key=key)
    g1 = c.set_value("svc/x", "v1").generation
    hive_copy = hive.load("svc/x")  # hive's in-memory copy: holdfast_generation g1 inside
    assert hive_copy.model_extra.get("holdfast_generation") == g1
    g2 = c.set_value("svc/x", "v2").generation
    assert g2 == g1 + 1
    seen = c.get("svc/x")  # a client reads v2 at g2
    assert (seen.value(), seen.generation) == ("v2", g2)
    # hive edits its old copy and saves it (in place, its own way).
    hive_copy.keys["note"] = CredentialKey(name="note", value=SecretStr("hive's edit"))
    hive.save(hive_copy)
    now = c.get("svc/x")
    assert now.value() == "v1" and now.value("note") == "hive's edit"
    print("generations: holdfast %d, %d; hive saved its copy of %d; holdfast now reports %d"
          % (g1, g2, g1, now.generation))
    assert now.generation > g2, "the generation went back (or stayed) after hive's write"
    # The client that read v2 cannot overwrite hive's edit with a compare-and-swap ...
    with pytest.raises(Conflict):
        c.set_value("svc/x", "from-a-stale-read", if_generation=g2)
    with pytest.raises(Conflict):
        c.set_value("svc/x", "from-an-older-read", if_generation=g1)
    assert c.get("svc/x").value("note") == "hive's edit"
    # ... and one that read hive's version can.
    after = c.set_value("svc/x", "v3", if_generation=now.generation).generation
    assert after == now.generation + 1
    # The CLI reads the same generation.
    out = daemon.cli("--json", "cred", "get", "svc/x")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["generation"] == after
    c.close()


def test_every_document_the_daemon_accepts_loads_in_hive(daemon):
    """A credential holdfast stores must be one hive's own model loads: documents with field
    types hive refuses are refused (invalid_params) before anything is written; the ones it
    accepts (its coercions included) load in hive's EncryptedFileStorage."""
    from holdfast_client import InvalidParams

    c = daemon.client()
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default",
                                encryption_key=key)

    def doc(cid, **over):
        d = {"id": cid, "credential_type": "api_key",
             "keys": {"k": {"name": "k", "value": "v", "expires_at": None, "metadata": {}}}}
        for f, v in over.items():
            if f.startswith("key_"):
                d["keys"]["k"][f[4:]] = v
            else:
                d[f] = v
        return d

    refused = {
        "type": dict(credential_type="X"), "tags": dict(tags="s"),
        "tags-ints": dict(tags=[1]), "created": dict(created_at="s"),
        "use-count": dict(use_count="s"), "key-expires": dict(key_expires_at="s"),
        "key-metadata": dict(key_metadata="s"), "key-metadata-null": dict(key_metadata=None),
        "description-null": dict(description=None), "keys-null": dict(keys=None),
        "provider": dict(provider_id=5),
    }
    accepted = {
        "plain": {}, "custom": dict(credential_type="custom"),
        "date-only": dict(key_expires_at="2026-01-01"),
        "offset": dict(key_expires_at="2026-01-01T00:00:00+0200"),
        "extras": dict(team="infra", key_rotation="weekly"),
        "last-used-null": dict(last_used=None),
    }
    for name, over in refused.items():
        with pytest.raises(InvalidParams):
            c.set(doc("bad/" + name, **over))
        assert not c.exists("bad/" + name)
    for name, over in accepted.items():
        c.set(doc("ok/" + name, **over))
        loaded = hive.load("ok/" + name)
        assert loaded is not None and loaded.id == "ok/" + name, name
    print("documents hive refuses: %d refused by the daemon; %d accepted, each loaded by hive"
          % (len(refused), len(accepted)))
    c.close()


def test_no_time_the_daemon_accepts_is_one_hive_refuses(daemon):
    """Explores the times a client may send (a fixed set of edges plus seeded mutations of
    them): every one the daemon accepts in a credential must load in hive's own model
    (pydantic's datetime parser). An independent tester wrote `2026-02-30` and `+99:00`
    offsets that holdfast acknowledged and hive then could not load."""
    import random

    from holdfast_client import InvalidParams

    c = daemon.client()
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default",
                                encryption_key=key)
    seeds = ["2026-01-01T00:00:00", "2024-02-29T23:59:59.5+05:30", "2026-12-31 12:00Z",
             "2026-06-30", "2026-01-01T00:00:00,25-0800", "9999-12-31T23:59:59z"]
    edges = ["2026-02-30T00:00:00", "2026-02-29", "2100-02-29", "2000-02-29", "2026-04-31",
             "2026-01-01T00:00:60", "2026-01-01T24:00:00", "2026-01-01T00:00:00+24:00",
             "2026-01-01T00:00:00+99:00", "2026-01-01T00:00:00+00:60", "0000-01-01",
             "2026-01-01T00:00:00+02", "1700000000", 1700000000, 1.5, -1, 2e10, 2e10 + 1,
             1e15, 1e300, -1e20, True, [], {}]
    rng = random.Random(int(os.environ.get("HOLDFAST_TIME_SEED", "34")))
    # Mostly digits: a changed digit keeps the shape and tests the ranges (days, offsets).
    alphabet = "0123456789" * 4 + "-:T tZz+.,"

    def mutate(t):
        t = list(t)
        for _ in range(rng.randint(1, 2)):
            op = rng.choice([0, 0, 0, 1, 2])
            i = rng.randrange(len(t) + 1)
            if op == 0 and t:
                t[min(i, len(t) - 1)] = rng.choice(alphabet)
            elif op == 1:
                t.insert(i, rng.choice(alphabet))
            elif t:
                del t[min(i, len(t) - 1)]
        return "".join(t)

    n = int(os.environ.get("HOLDFAST_TIME_CASES", "300"))
    candidates = edges + seeds + [mutate(rng.choice(seeds)) for _ in range(n)]
    accepted = refused = 0
    wrong = []
    for i, when in enumerate(candidates):
        cid = "time/%d" % i
        d = {"id": cid, "credential_type": "api_key",
             "keys": {"k": {"name": "k", "value": "v", "expires_at": when, "metadata": {}}}}
        try:
            c.set(d)
        except InvalidParams:
            refused += 1
            continue
        accepted += 1
        try:
            loaded = hive.load(cid)
            assert loaded is not None and loaded.id == cid
        except Exception as e:  # noqa: BLE001 - any failure to load is the defect
            wrong.append((when, str(e).splitlines()[0]))
    print("times explored: %d (seed %s): %d accepted, each loaded by hive; %d refused; %d hive "
          "could not load" % (len(candidates), os.environ.get("HOLDFAST_TIME_SEED", "34"),
                              accepted, refused, len(wrong)))
    assert not wrong, wrong
    assert accepted > 10 and refused > 10, "the exploration did not reach both sides"
    c.close()


def test_hive_lists_what_holdfast_wrote_within_the_promised_lag(daemon):
    """docs/design.md "Index rewrites in the daemon": under writes that never pause, hive's own
    list_all() shows a credential within 5.25 s of its acknowledgement (INDEX_MAX_LAG plus a
    flusher tick), and within 0.5 s once the writes pause; hive's load() reads each one as
    soon as it is acknowledged."""
    storage = HoldfastCredentialStorage(socket_path=daemon.socket)
    key = daemon.key_file().read_bytes().strip()
    hive = EncryptedFileStorage(daemon.home / "state/holdfast/stores/default",
                                encryption_key=key)
    acked = {}  # id -> time its save returned
    stop = threading.Event()
    lags, polls, errors = [], [0], []

    def poll():
        seen = set()
        while not stop.is_set():
            try:
                listed = set(hive.list_all())
            except Exception as e:  # a torn index would land here: holdfast writes atomically
                errors.append(repr(e))
                continue
            now = time.monotonic()
            polls[0] += 1
            for cid in listed - seen:
                if cid in acked:
                    lags.append(now - acked[cid])
            seen |= listed
            # Nothing acknowledged more than 5.25 s (+ scheduling slack) ago is missing.
            late = [c for c, t in list(acked.items()) if now - t > 5.75 and c not in listed]
            if late:
                errors.append("listed late: %s" % late[:3])
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.monotonic()
    i = 0
    try:
        while time.monotonic() - start < 7.0:  # writes that never pause for 250 ms
            cid = "lag/%04d" % i
            storage.save(cred(cid, "sk-%d" % i))
            acked[cid] = time.monotonic()
            if i % 50 == 0:  # hive's load reads the file: no lag at all
                assert secrets_of(hive.load(cid)) == {"api_key": "sk-%d" % i}
            i += 1
            time.sleep(0.005)
        paused = time.monotonic()
        while time.monotonic() - paused < 3 and set(hive.list_all()) < set(acked):
            time.sleep(0.02)
        after_pause = time.monotonic() - paused
    finally:
        stop.set()
        poller.join()
        storage.close()
    assert not errors, errors[:3]
    assert set(hive.list_all()) >= set(acked)
    assert after_pause <= 0.75, after_pause
    # The lag is the write-behind's, not zero: the index is not rewritten per write.
    print("\n  %d saves over 7 s, hive list_all polled %d times: lag to list_all max %.2f s, "
          "median %.2f s; everything listed %.2f s after the writes paused"
          % (len(acked), polls[0], max(lags), sorted(lags)[len(lags) // 2], after_pause))
    assert max(lags) <= 5.75


SAVE_WORKER = r"""
import os, sys, time
sys.path[:0] = %(paths)r
from pydantic import SecretStr
from framework.credentials.models import CredentialKey, CredentialObject
from framework.credentials.storage import EncryptedFileStorage
from framework.credentials.store import CredentialStore
from holdfast_client.hive import HoldfastCredentialStorage
kind, proc, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "hive":
    storage = EncryptedFileStorage(os.environ["STORE"], encryption_key=os.environ["KEY"].encode())
else:
    storage = HoldfastCredentialStorage(socket_path=os.environ["SOCKET"])
store = CredentialStore(storage=storage)
while not os.path.exists(go):
    time.sleep(0.001)
errors = 0
for rnd in ("v1", "v2"):          # 50 ids, each saved twice: 100 saves; the last is v2
    for i in range(50):
        c = CredentialObject(id="p%%d_%%d" %% (proc, i), keys={"api_key": CredentialKey(
            name="api_key", value=SecretStr("%%s-p%%d-%%d" %% (rnd, proc, i)))})
        try:
            store.save_credential(c)
        except Exception:
            errors += 1
print(errors)
"""


def run_savers(kind, env, procs=4):
    go = Path(tempfile.mkdtemp(prefix="hf-go-")) / "go"
    script = SAVE_WORKER % {"paths": [str(HERE.parent)]}
    ps = [subprocess.Popen([sys.executable, "-c", script, kind, str(p), str(go)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for p in range(procs)]
    time.sleep(0.5)  # every process is waiting at the barrier
    go.touch()
    errors = 0
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        errors += int(out.strip() or 0)
    return errors


def check_all(load, list_all, procs=4):
    listed = set(list_all())
    lost, wrong = 0, 0
    for p in range(procs):
        for i in range(50):
            cid = "p%d_%d" % (p, i)
            if cid not in listed:
                lost += 1
            try:
                c = load(cid)
                ok = c is not None and c.keys["api_key"].get_secret_value() == "v2-p%d-%d" % (p, i)
            except Exception:
                ok = False
            wrong += not ok
    return len(listed), lost, wrong


def test_four_processes_x_100_saves_hive_loses_index_entries_holdfast_none(daemon, tmp_path):
    key = Fernet.generate_key()
    base = tmp_path / "hive-store"
    EncryptedFileStorage(base, encryption_key=key)
    env = dict(os.environ, STORE=str(base), KEY=key.decode(), SOCKET=daemon.socket)
    hive_errors = run_savers("hive", env)
    reader = EncryptedFileStorage(base, encryption_key=key)
    h_listed, h_lost, h_wrong = check_all(reader.load, reader.list_all)

    hf_errors = run_savers("holdfast", env)
    storage = HoldfastCredentialStorage(socket_path=daemon.socket)
    f_listed, f_lost, f_wrong = check_all(storage.load, storage.list_all)
    storage.close()
    print("\n4 processes x 100 saves through hive's CredentialStore (200 ids, each saved twice):")
    print("  hive EncryptedFileStorage:  list_all %3d/200, lost %3d index entries, %3d values "
          "not the last write, %d save errors" % (h_listed, h_lost, h_wrong, hive_errors))
    print("  HoldfastCredentialStorage:  list_all %3d/200, lost %3d index entries, %3d values "
          "not the last write, %d save errors" % (f_listed, f_lost, f_wrong, hf_errors))
    if h_lost == 0:
        print("  (hive happened to lose no entry in this run)")
    assert (f_listed, f_lost, f_wrong, hf_errors) == (200, 0, 0, 0)


MIXED_WORKER = r"""
import os, subprocess, sys, time
sys.path[:0] = %(paths)r
from pydantic import SecretStr
from framework.credentials.models import CredentialKey, CredentialObject
from framework.credentials.storage import EncryptedFileStorage
from holdfast_client.hive import HoldfastCredentialStorage
kind, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "hive":
    storage = EncryptedFileStorage(os.environ["STORE"], encryption_key=os.environ["KEY"].encode())
elif kind == "daemon":
    storage = HoldfastCredentialStorage(store="hive", socket_path=os.environ["SOCKET"])
while not os.path.exists(go):
    time.sleep(0.001)
acked = []
for rnd in ("v1", "v2"):
    for i in range(n):
        cid, value = "%%s_%%d" %% (kind, i), "%%s-%%s-%%d" %% (rnd, kind, i)
        if kind.startswith("cli"):
            ok = subprocess.run([os.environ["BIN"], "--offline", "--hive", "cred", "set", cid],
                                input=value + "\n", capture_output=True, text=True,
                                timeout=60).returncode == 0
        else:
            c = CredentialObject(id=cid, keys={"api_key": CredentialKey(
                name="api_key", value=SecretStr(value))})
            try:
                storage.save(c)
                ok = True
            except Exception:
                ok = False
        if ok:
            acked.append("%%s=%%s" %% (cid, value))
print("\n".join(acked))
"""


def test_the_daemon_two_offline_clis_and_hive_write_one_store_at_once(make_daemon, tmp_path):
    """Issue 16: concurrent foreign writers. hive's store (made by hive, umask 022) served by
    the daemon; at once, through a barrier: a process saving through the daemon
    (HoldfastCredentialStorage), two processes running `holdfast --offline --hive cred set`
    (the CLI opening the files itself, with the same locks), and a process saving with hive's
    own EncryptedFileStorage (hive's index rewrite takes no lock: it may drop entries others
    wrote). Each writes 25 ids twice. Afterwards nothing any writer was told is saved is lost:
    after the daemon's next reconciliation it lists every id with its last value, and hive's
    own reader lists them all too once the daemon has rewritten the index."""
    root = Path(tempfile.mkdtemp(prefix="hf-mixed-"))
    base, key_path, key = hive_store_umask_022(root, n=0)
    d = make_daemon(config='[stores.hive]\npath = "%s"\nkey_file = "%s"\n' % (base, key_path))
    env = dict(d.env, STORE=str(base), KEY=key.decode(), SOCKET=d.socket, BIN=BIN,
               HIVE_HOME=str(root / ".hive"))
    go = tmp_path / "go"
    n = 25
    script = MIXED_WORKER % {"paths": [str(HERE.parent)]}
    kinds = ["daemon", "cli1", "cli2", "hive"]
    ps = {k: subprocess.Popen([sys.executable, "-c", script, k, str(go), str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for k in kinds}
    time.sleep(0.5)  # every writer waits at the barrier
    started = time.monotonic()
    go.touch()
    acked = {}
    for k, p in ps.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        for line in out.split():
            cid, value = line.split("=", 1)
            acked[cid] = value  # v2 after v1: the last acknowledged value
    wrote = time.monotonic() - started
    every = {"%s_%d" % (k, i) for k in kinds for i in range(n)}
    # Every writer's v2 acknowledged (nothing refused under contention).
    assert set(acked) == every, sorted(every - set(acked))
    assert all(v.startswith("v2-") for v in acked.values())
    # The daemon's next reconciliation (its watcher, or the periodic rescan) lists them all.
    storage = HoldfastCredentialStorage(store="hive", socket_path=d.socket)
    deadline = time.monotonic() + 45
    while set(storage.list_all()) != every and time.monotonic() < deadline:
        time.sleep(0.2)
    listed = set(storage.list_all())
    reconciled = time.monotonic() - started - wrote
    assert listed == every, ("missing", sorted(every - listed), "extra", sorted(listed - every))
    wrong = [cid for cid, v in acked.items()
             if storage.load(cid).keys["api_key"].get_secret_value() != v]
    storage.close()
    assert wrong == [], wrong
    # hive's own reader: the index the daemon keeps current lists everything too.
    deadline = time.monotonic() + 15
    hive = EncryptedFileStorage(base, encryption_key=key)
    while set(hive.list_all()) != every and time.monotonic() < deadline:
        time.sleep(0.2)
    hive_listed = set(hive.list_all())
    assert hive_listed == every, sorted(every - hive_listed)
    assert hive.load("cli1_3").keys["api_key"].get_secret_value() == "v2-cli1-3"
    print("\nconcurrent foreign writers on hive's store: daemon, 2 offline CLIs and hive's "
          "EncryptedFileStorage, %d ids x 2 saves each, %.1f s; %d/%d acknowledged, all "
          "listed by the daemon %.1f s after the writes, values the last acknowledged, hive "
          "lists all %d" % (n, wrote, len(acked), len(every), reconciled, len(hive_listed)))


def test_a_hive_store_made_under_umask_022_is_served_repaired_and_still_hives(make_daemon):
    root = Path(tempfile.mkdtemp(prefix="hf-hive-"))
    base, key_path, key = hive_store_umask_022(root)
    before = modes(base)
    assert before["."] == 0o755 and before["credentials/svc_0.enc"] == 0o644, before
    # The daemon serves it as store "hive" (what `holdfast import --from-hive` adds).
    d = make_daemon(config='[stores.hive]\npath = "%s"\nkey_file = "%s"\n' % (base, key_path))
    with d.client("agent") as hf:
        ids = sorted(c["id"] for c in hf.list(store="hive"))
        assert ids == ["svc/0", "svc/1", "svc/2"]
        assert hf.get("svc/1", store="hive").value() == "sk-hive-1"
    assert "tightened permissions" in d.log(), d.log()
    after = modes(base)
    assert after["."] == 0o700 and after["credentials/svc_0.enc"] == 0o600, after
    # A write through the daemon; then the damage two unpatched hive processes leave: an index
    # that lost entries. The CLI repairs it; hive itself reads everything afterwards.
    storage = HoldfastCredentialStorage(store="hive", socket_path=d.socket)
    storage.save(cred("svc/new", "sk-new"))
    storage.close()
    assert d.stop() == 0
    idx = base / "metadata" / "index.json"
    doc = json.loads(idx.read_text())
    dropped = sorted(doc["credentials"])[:2]
    for cid in dropped:
        del doc["credentials"][cid]
    idx.write_text(json.dumps(doc))
    assert sorted(EncryptedFileStorage(base, encryption_key=key).list_all()) != \
        ["svc/0", "svc/1", "svc/2", "svc/new"]
    env = dict(d.env, HIVE_HOME=str(root / ".hive"))
    out = subprocess.run([BIN, "--hive", "store", "fsck", "--repair"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([BIN, "--hive", "cred", "list", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    hive = EncryptedFileStorage(base, encryption_key=key)
    assert sorted(hive.list_all()) == ["svc/0", "svc/1", "svc/2", "svc/new"]
    assert hive.load("svc/new").keys["api_key"].get_secret_value() == "sk-new"
    assert hive.load("svc/2").keys["api_key"].get_secret_value() == "sk-hive-2"
    print("hive store (umask 022): served by the daemon (tightened %d paths), index entries "
          "dropped %s repaired by the CLI, all 4 read by hive's EncryptedFileStorage"
          % (sum(1 for k in before if before[k] != after.get(k)), dropped))
    d.cleanup()


def test_the_cli_opens_a_store_hive_made_and_imports_it(daemon):
    root = Path(tempfile.mkdtemp(prefix="hf-hive-cli-"))
    base, _, key = hive_store_umask_022(root)
    env = dict(daemon.env, HIVE_HOME=str(root / ".hive"))

    def hf(*args):
        return subprocess.run([BIN, *args], env=env, capture_output=True, text=True,
                              timeout=60)

    out = hf("--hive", "cred", "list", "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(c["id"] for c in json.loads(out.stdout)["credentials"]) == \
        ["svc/0", "svc/1", "svc/2"]
    assert out.stderr.count("tightened permissions") == 1, out.stderr
    assert "3 directories 0755 → 0700" in out.stderr, out.stderr
    out = hf("--hive", "cred", "get", "svc/1")
    assert (out.returncode, out.stdout.strip()) == (0, "sk-hive-1"), out.stderr
    assert "tightened" not in out.stderr, "the notice is said once"
    # import: a dry run, then a copy into the daemon's default store (through the daemon).
    out = hf("import", "--from-hive", "--copy", "--dry-run")
    assert out.returncode == 0 and "3 would be copied" in out.stdout, out.stdout + out.stderr
    out = hf("import", "--from-hive", "--copy")
    assert out.returncode == 0 and "copied 3 (3 new" in out.stdout, out.stdout + out.stderr
    storage = HoldfastCredentialStorage(socket_path=daemon.socket)
    assert secrets_of(storage.load("svc/2")) == {"api_key": "sk-hive-2"}
    storage.close()
    # hive still reads its store, and writes to it.
    hive = EncryptedFileStorage(base, encryption_key=key)
    hive.save(cred("svc/3", "sk-hive-3"))
    assert sorted(hive.list_all()) == ["svc/0", "svc/1", "svc/2", "svc/3"]
    out = hf("--hive", "cred", "get", "svc/3")
    assert out.stdout.strip() == "sk-hive-3", out.stderr


def test_holdfast_hive_daemon_serves_hives_own_store(make_daemon):
    made = {}

    def setup(home):  # hive's store in the daemon's HOME, where --hive looks ($HOME/.hive)
        made["base"], _, made["key"] = hive_store_umask_022(home, n=2)

    d = make_daemon(args=["--hive"], setup=setup)
    with d.client("agent") as hf:
        assert [c["id"] for c in hf.list(store="hive")] == ["svc/0", "svc/1"]
        assert hf.get("svc/0", store="hive").value() == "sk-hive-0"
        hf.set_value("from-holdfast", "sk-x", store="hive")
        names = [s["name"] for s in hf.status()["stores"]]
        assert names == ["default", "hive"], names
    assert "tightened permissions" in d.log()
    hive = EncryptedFileStorage(made["base"], encryption_key=made["key"])
    assert hive.load("from-holdfast").keys["api_key"].get_secret_value() == "sk-x"
    out = d.cli("--store-dir", str(made["base"]), "daemon")
    assert out.returncode == 2 and "[stores.NAME]" in out.stderr, out.stderr


def test_ids_hive_takes_and_holdfast_refuses_are_never_listed_unreachable(make_daemon, caplog):
    """hive takes any id (`-dash`, `.dot`, a newline, a bidirectional override); the daemon,
    serving hive's store in place, listed them, then refused load, exists and delete of each
    with invalid_params, so hive's CredentialStore failed on the first listed id. holdfast
    serves no such id (docs/security.md row 9): they are not listed (a warning says how many
    and where to look), a load of one says why, fsck names their files, and hive's own index
    and files keep them."""
    odd = ["-dash", ".dot", "a\nb", "a\u202eb", "tab\tin"]
    made = {}

    def setup(home):
        made["base"], _, made["key"] = hive_store_umask_022(home, n=1)
        hive = EncryptedFileStorage(made["base"], encryption_key=made["key"])
        for cid in odd + ["sp ace"]:
            hive.save(cred(cid, "sk-" + cid))

    d = make_daemon(args=["--hive"], setup=setup)
    storage = HoldfastCredentialStorage("hive", socket_path=d.socket)
    store = CredentialStore(storage=storage)
    with caplog.at_level("WARNING", logger="holdfast_client.hive"):
        listed = storage.list_all()
    assert listed == ["svc/0", "sp ace"]
    assert "5 credential(s) in store 'hive' not listed" in caplog.text, caplog.text
    for cid, value in zip(listed, ["sk-hive-0", "sk-sp ace"]):  # all listed is reachable
        assert store.get_credential(cid).keys["api_key"].get_secret_value() == value
    with pytest.raises(hc.InvalidParams, match="must not start with"):
        storage.load("-dash")
    fsck = d.cli("--hive", "store", "fsck")
    for name in ("-dash.enc", ".dot.enc", "a\\nb.enc", "tab\\tin.enc"):
        assert name in fsck.stdout, fsck.stdout
    assert "ids holdfast does not serve" in fsck.stdout
    hive = EncryptedFileStorage(made["base"], encryption_key=made["key"])
    assert sorted(hive.list_all()) == sorted(["svc/0", "sp ace"] + odd)
    assert hive.load("-dash").keys["api_key"].get_secret_value() == "sk--dash"
    storage.close()


# ---------------------------------------------------------------------------------------------
# Runtime logs


def drive(logger, n_nodes=5):
    """The race of hive's executor: for each node, log_node_complete (the node itself) and
    ensure_node_logged (the executor's fallback) at the same moment, 10 threads behind one
    barrier."""
    barrier = threading.Barrier(2 * n_nodes)

    def complete(k):
        barrier.wait()
        logger.log_node_complete("n%d" % k, "Node %d" % k, "event_loop", True,
                                 tokens_used=100, input_tokens=60, output_tokens=40,
                                 latency_ms=10, total_steps=2)

    def ensure(k):
        barrier.wait()
        logger.ensure_node_logged("n%d" % k, "Node %d" % k, "event_loop", True,
                                  tokens_used=100, latency_ms=10)

    ts = [threading.Thread(target=f, args=(k,)) for k in range(n_nodes)
          for f in (complete, ensure)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


async def drive_async(logger, n_nodes=5):
    """The same race as tasks: asyncio.gather of the two calls per node in worker threads."""
    calls = []
    for k in range(n_nodes):
        calls.append(asyncio.to_thread(
            logger.log_node_complete, "n%d" % k, "Node %d" % k, "event_loop", True,
            tokens_used=100, input_tokens=60, output_tokens=40, latency_ms=10, total_steps=2))
        calls.append(asyncio.to_thread(
            logger.ensure_node_logged, "n%d" % k, "Node %d" % k, "event_loop", True,
            tokens_used=100, latency_ms=10))
    await asyncio.gather(*calls)


def test_the_node_logging_race_hive_doubles_holdfast_logs_once(daemon, tmp_path):
    rounds, n = 10, 5
    totals = {}
    for name in ("hive", "holdfast"):
        entries, tokens = 0, 0
        for r in range(rounds):
            for mode in ("threads", "gather"):
                if name == "hive":
                    store = RuntimeLogStore(tmp_path / ("logs-%d-%s" % (r, mode)))
                    logger = RuntimeLogger(store=store, agent_id="racer")
                else:
                    logger = HoldfastRuntimeLogger(agent_id="racer", socket_path=daemon.socket)
                run_id = logger.start_run(goal_id="g")

                async def body():
                    if mode == "threads":
                        await asyncio.to_thread(drive, logger, n)
                    else:
                        await drive_async(logger, n)
                    await logger.end_run("success", duration_ms=5, node_path=[])

                asyncio.run(body())
                if name == "hive":
                    s = asyncio.run(store.load_summary(run_id))
                    lines = store.read_node_details_sync(run_id)
                    assert s.total_nodes_executed == len(lines)
                    entries += len(lines)
                    tokens += sum(nd.tokens_used for nd in lines)
                else:
                    with daemon.client("reader") as c:
                        got = c.run_get(run_id)
                    assert got["summary"]["total_nodes_executed"] == n, got["summary"]
                    entries += len(got["details"])
                    tokens += sum(d["tokens_used"] for d in got["details"])
                    # The node's own completion wins over the fallback, whichever came first.
                    assert all(d["input_tokens"] == 60 for d in got["details"]), got["details"]
                    logger.close()
        totals[name] = (entries, tokens)
    runs = rounds * 2
    want = (runs * n, runs * n * 100)
    print("\nensure_node_logged vs log_node_complete, %d runs x %d nodes (10 threads behind a "
          "barrier, and asyncio.gather), want %d entries / %d tokens_used:" % (runs, n, *want))
    print("  hive RuntimeLogger:     %4d entries, %6d tokens_used logged" % totals["hive"])
    print("  HoldfastRuntimeLogger:  %4d entries, %6d tokens_used logged" % totals["holdfast"])
    assert totals["holdfast"] == want


def sequence(logger):
    """A run with steps, a failed node past hive's thresholds, a fallback entry."""
    run_id = logger.start_run(goal_id="goal-1")
    logger.log_step("plan", "event_loop", 0, llm_text="thinking", input_tokens=300,
                    output_tokens=50, tool_calls=[{"tool_use_id": "t1", "tool_name": "search",
                                                   "tool_input": {"q": "x"}, "content": "3 hits"}])
    logger.log_node_complete("plan", "Plan", "event_loop", True, total_steps=1,
                             tokens_used=350, input_tokens=300, output_tokens=50, latency_ms=900)
    logger.log_node_complete("act", "Act", "event_loop", False, error="tool exploded",
                             retry_count=5, latency_ms=61000, tokens_used=20,
                             input_tokens=15, output_tokens=5, exit_status="failure")
    logger.ensure_node_logged("act", "Act", "event_loop", False, error="tool exploded")
    logger.ensure_node_logged("review", "Review", "event_loop", True, tokens_used=7)
    asyncio.run(logger.end_run("failure", duration_ms=1234,
                               node_path=["plan", "act", "review"],
                               execution_quality="degraded"))
    return run_id


def test_the_drop_in_writes_the_summary_hive_would(daemon, tmp_path):
    store = RuntimeLogStore(tmp_path / "hive-logs")
    hive_run = sequence(RuntimeLogger(store=store, agent_id="agent-9"))
    hive_summary = asyncio.run(store.load_summary(hive_run)).model_dump()
    hf = HoldfastRuntimeLogger(agent_id="agent-9", socket_path=daemon.socket)
    hf_run = sequence(hf)
    hf.close()
    with daemon.client("reader") as c:
        got = c.run_get(hf_run)
    ours = got["summary"]
    for k in ("run_id", "started_at"):
        hive_summary.pop(k)
        ours.pop(k)
    assert ours == hive_summary
    # The lines themselves have hive's fields (and holdfast's own: seq, logged_at_ms, the
    # logger's writer token, which hive's models ignore), and hive's own tooling loads
    # holdfast's files.
    ours_only = {"seq", "logged_at_ms", "writer"}
    assert set(got["details"][0]) - ours_only == set(NodeDetail.model_fields)
    assert set(got["steps_log"][0]) - ours_only == set(NodeStepLog.model_fields)
    assert not ours_only & (set(NodeDetail.model_fields) | set(NodeStepLog.model_fields))
    logs = RuntimeLogStore(daemon.home / "state" / "holdfast")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # hive's legacy runs/<id> layout
        loaded = asyncio.run(logs.load_summary(hf_run))
        details = asyncio.run(logs.load_details(hf_run))
        steps = asyncio.run(logs.load_tool_logs(hf_run))
    assert loaded.total_nodes_executed == 3 and loaded.needs_attention
    assert [nd.node_id for nd in details.nodes] == ["plan", "act", "review"]
    assert steps.steps[0].tool_calls[0].result == "3 hits"
    print("summary equal to hive's for the same calls: %s" % json.dumps(ours, sort_keys=True))


def test_importable_and_clear_without_hive(daemon):
    script = r"""
import sys
sys.path.insert(0, %r)
sys.modules["framework"] = None          # hive is not installed here
import holdfast_client.hive as h
assert h.HIVE_IMPORT_ERROR is not None
try:
    h.HoldfastCredentialStorage(socket_path=%r)
except ImportError as e:
    assert "pip install aden-hive" in str(e), e
else:
    raise SystemExit("no ImportError")
import asyncio
lg = h.HoldfastRuntimeLogger(agent_id="plain", socket_path=%r)
rid = lg.start_run(goal_id="g")
lg.log_node_complete("n", "N", "t", True, input_tokens=1, output_tokens=2)
asyncio.run(lg.end_run("success", 3))
print(rid)
""" % (str(HERE.parent), daemon.socket, daemon.socket)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    with daemon.client("reader") as c:
        assert c.run_get(out.stdout.strip())["summary"]["total_output_tokens"] == 2


# ---------------------------------------------------------------------------------------------
# The runtime logger behaves as hive's: resurrection, visits, one connection, hive's layout


def comparable(summary):
    """A summary without what differs between two runs of the same work (ids, times)."""
    s = dict(summary)
    for k in ("run_id", "started_at", "duration_ms", "trace_id", "execution_id"):
        s.pop(k, None)
    return s


def entries(details):
    return [(d.node_id, d.success, d.tokens_used, d.needs_attention) for d in details]


async def resurrected_execution(tmp, llm_fails_first_in):
    """hive's own ExecutionManager (max_resurrections=3, its default) runs a graph of three
    event-loop nodes, alpha -> beta -> gamma, with a fake model that fails once in the nodes
    named: the execution fails, hive resurrects it with the same logger and session, and the
    next attempt succeeds. The runtime logger is whatever framework.tracker.runtime_logger's
    RuntimeLogger is (the test patches the drop-in in). Returns (result, store, run id)."""
    import hashlib
    from types import SimpleNamespace
    from unittest.mock import MagicMock

    from framework.host.execution_manager import EntryPointSpec, ExecutionManager
    from framework.llm.provider import LLMProvider, LLMResponse
    from framework.llm.stream_events import FinishEvent, TextDeltaEvent
    from framework.orchestrator.edge import EdgeCondition, EdgeSpec, GraphSpec
    from framework.orchestrator.goal import Goal
    from framework.orchestrator.node import NodeSpec

    names = ("alpha", "beta", "gamma")

    class FakeLLM(LLMProvider):
        model = "fake"

        def __init__(self):
            self.fail = set(llm_fails_first_in)
            self.calls = 0

        async def stream(self, messages, system="", tools=None, max_tokens=4096, **kw):
            node = next(n for n in names if "You are node %s." % n in system)
            self.calls += 1
            if node in self.fail:
                self.fail.discard(node)
                raise ValueError("fake model returned garbage in " + node)
            # Text unlike every earlier answer (hive fails a node that repeats itself).
            text = " ".join(hashlib.sha256(b"%d-%d" % (self.calls, i)).hexdigest()
                            for i in range(3))
            yield TextDeltaEvent(content=text, snapshot=text)
            yield FinishEvent(stop_reason="stop", input_tokens=7, output_tokens=3, model="fake")

        def complete(self, messages, system="", **kw):
            return LLMResponse(content="summary", model="fake", stop_reason="stop")

    nodes = [NodeSpec(id=n, name=n.title(), description="node " + n, node_type="event_loop",
                      output_keys=[], system_prompt="You are node %s." % n) for n in names]
    edges = [EdgeSpec(id="e%d" % i, source=a, target=b, condition=EdgeCondition.ON_SUCCESS)
             for i, (a, b) in enumerate(zip(names, names[1:]))]
    graph = GraphSpec(id="resurrected-agent", goal_id="goal-r", entry_node="alpha",
                      entry_points={"start": "alpha"}, terminal_nodes=["gamma"], nodes=nodes,
                      edges=edges)
    goal = Goal(id="goal-r", name="goal-r", description="a goal worth three tries")
    spec = EntryPointSpec(id="start", name="Start", entry_node="alpha", trigger_type="manual")
    assert spec.max_resurrections == 3
    store = RuntimeLogStore(tmp / "runtime_logs")
    em = ExecutionManager(stream_id="start", entry_spec=spec, graph=graph, goal=goal,
                          state_manager=MagicMock(), storage=SimpleNamespace(base_path=tmp),
                          llm=FakeLLM(), runtime_log_store=store)
    await em.start()
    execution_id = await em.execute({"task": "resurrect me"})
    result = await asyncio.wait_for(em.wait_for_completion(execution_id), 120)
    return result, store, execution_id


def test_a_resurrected_hive_run_ends_as_with_hives_logger(daemon, tmp_path, monkeypatch):
    """hive's ExecutionManager resurrects a failed execution with the same logger and session:
    hive's logger appends to the same log and summarizes every attempt. The drop-in refused
    every write after its first end_run (`Conflict: run ... has ended`), hive counted each as
    a node failure, and every resurrection failed."""
    import warnings

    import framework.tracker.runtime_logger as hive_runtime_logger

    got = {}
    for name in ("hive", "holdfast"):
        tmp = tmp_path / name
        tmp.mkdir()
        if name == "holdfast":
            monkeypatch.setattr(
                hive_runtime_logger, "RuntimeLogger",
                lambda store, agent_id="": HoldfastRuntimeLogger(
                    store=store, agent_id=agent_id, socket_path=daemon.socket))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # hive's exec_* ids
            result, store, run_id = asyncio.run(resurrected_execution(tmp, ["beta"]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # hive reads the run where it looks, unwarned
            summary = asyncio.run(store.load_summary(run_id))
            details = asyncio.run(store.load_details(run_id)).nodes
            steps = asyncio.run(store.load_tool_logs(run_id)).steps
        got[name] = (result.success, comparable(summary.model_dump()), entries(details),
                     [(s.node_id, s.step_index, s.is_partial, s.input_tokens) for s in steps])
        if name == "holdfast":
            with daemon.client("reader") as c:
                ours = c.run_get(run_id)
            assert ours["ended"] and comparable(ours["summary"]) == got[name][1]
            assert [d["attempt"] for d in ours["details"]] == [1, 1, 2, 2, 1], ours["details"]
        print("%-8s success=%s summary=%s\n         entries=%s\n         steps=%s"
              % (name, got[name][0], json.dumps(got[name][1], sort_keys=True), got[name][2],
                 got[name][3]))
    assert got["hive"][0] is True
    assert got["hive"][1]["status"] == "success"
    assert got["hive"][1]["total_nodes_executed"] == 5  # alpha, beta (failed), alpha, beta, gamma
    assert got["holdfast"] == got["hive"]


def visits(logger):
    """hive's calls for a node retried after a failure (each attempt completes, then the
    executor's fallback check), a node a feedback loop visits twice with no fallback check,
    a node that never logs itself (the fallback writes its entry, twice checked), and the
    same node visited again, logging itself that time."""
    run_id = logger.start_run(goal_id="goal-v")
    logger.log_step("fetch", "event_loop", 0, llm_text="first try", input_tokens=80)
    logger.log_node_complete("fetch", "Fetch", "event_loop", False, error="timeout",
                             tokens_used=100, input_tokens=80, output_tokens=20)
    logger.ensure_node_logged("fetch", "Fetch", "event_loop", False, error="timeout")
    logger.log_step("fetch", "event_loop", 0, llm_text="second try", input_tokens=40)
    logger.log_node_complete("fetch", "Fetch", "event_loop", True, tokens_used=50,
                             input_tokens=40, output_tokens=10)
    logger.ensure_node_logged("fetch", "Fetch", "event_loop", True, tokens_used=50)
    for _ in range(2):
        logger.log_node_complete("review", "Review", "event_loop", True, tokens_used=30,
                                 input_tokens=20, output_tokens=10)
    logger.ensure_node_logged("plain", "Plain", "event_loop", True, tokens_used=9)
    logger.ensure_node_logged("plain", "Plain", "event_loop", True, tokens_used=9)
    asyncio.run(logger.end_run("success", duration_ms=10,
                               node_path=["fetch", "review", "review", "plain"]))
    return run_id


def test_each_visit_of_a_node_is_an_entry_as_in_hive(daemon, tmp_path):
    """A retried node and a feedback loop's revisit are entries of their own in hive (its
    node_worker passes no attempt): the drop-in kept one entry per node id, so a node that
    failed and then succeeded showed 1 entry, 50 tokens and no attention where hive shows 2,
    150 and needs_attention."""
    store = RuntimeLogStore(tmp_path / "hive")
    hive_run = visits(RuntimeLogger(store=store, agent_id="v"))
    want = comparable(asyncio.run(store.load_summary(hive_run)).model_dump())
    want_entries = entries(asyncio.run(store.load_details(hive_run)).nodes)
    ours_store = RuntimeLogStore(tmp_path / "holdfast")
    hf_run = visits(HoldfastRuntimeLogger(store=ours_store, agent_id="v",
                                          socket_path=daemon.socket))
    with daemon.client("reader") as c:
        got = c.run_get(hf_run)
    print("hive:     %s\nholdfast: %s" % (want_entries,
                                         [(d["node_id"], d["success"], d["tokens_used"],
                                           d["needs_attention"]) for d in got["details"]]))
    fetch = [d for d in got["details"] if d["node_id"] == "fetch"]
    assert (len(fetch), sum(d["tokens_used"] for d in fetch)) == (2, 150)
    assert got["summary"]["needs_attention"] is True
    assert comparable(got["summary"]) == want
    assert [(d["node_id"], d["success"], d["tokens_used"], d["needs_attention"])
            for d in got["details"]] == want_entries
    # The entry's attempt is the visit's number for its node.
    assert [(d["node_id"], d["attempt"]) for d in got["details"]] == \
        [("fetch", 1), ("fetch", 2), ("review", 1), ("review", 2), ("plain", 1)]
    # Each visit's steps (hive numbers them from 0 again), read by hive's own store (hive's
    # logger put a run without a session id in its deprecated layout: hive warns there).
    import warnings

    def steps_in(st, r, warn):
        with warnings.catch_warnings():
            warnings.simplefilter(warn)
            return [(x.node_id, x.step_index, x.llm_text)
                    for x in asyncio.run(st.load_tool_logs(r)).steps]

    hive_steps = steps_in(store, hive_run, "ignore")
    assert steps_in(ours_store, hf_run, "error") == hive_steps == \
        [("fetch", 0, "first try"), ("fetch", 0, "second try")]


def side_by_side(daemon, tmp_path, calls):
    """``calls(logger)`` with hive's RuntimeLogger and with the drop-in, each in a run of its
    own read back by hive's RuntimeLogStore: (entries, steps, summary) of each."""
    import warnings

    got = {}
    for name in ("hive", "holdfast"):
        logger, store = side_by_side_logger(name, tmp_path, "side", daemon)
        run_id = logger.start_run("g", session_id="session_20260101_000000_" + name)
        calls(logger)
        asyncio.run(logger.end_run("success", 1))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nodes = asyncio.run(store.load_details(run_id)).nodes
            tool_logs = asyncio.run(store.load_tool_logs(run_id))  # None: no step logged
            steps = tool_logs.steps if tool_logs is not None else []
            summary = asyncio.run(store.load_summary(run_id))
        got[name] = ([(n.node_id, n.success, n.error, n.tokens_used, n.input_tokens,
                       n.needs_attention) for n in nodes],
                     [(s.node_id, s.step_index, s.llm_text, s.input_tokens) for s in steps],
                     comparable(summary.model_dump()))
        print("%-8s entries=%s\n         steps=%s" % (name, got[name][0], got[name][1]))
    return got


def retry_after_a_crash(lg):
    # hive's retry path: attempt 1 raises before the node logs itself (the executor's exception
    # handler writes the fallback entry), attempt 2 logs itself, then the fallback check.
    lg.ensure_node_logged("fetch", "Fetch", "event_loop", False, error="boom",
                          stacktrace="Traceback...")
    lg.log_node_complete("fetch", "Fetch", "event_loop", True, tokens_used=50,
                         input_tokens=40, output_tokens=10)
    lg.ensure_node_logged("fetch", "Fetch", "event_loop", True, tokens_used=50)


def fallback_then_a_visit_logging_itself(lg):
    lg.ensure_node_logged("plain", "Plain", "event_loop", True, tokens_used=9)
    lg.log_node_complete("plain", "Plain", "event_loop", False, error="bad", tokens_used=40)
    lg.ensure_node_logged("plain", "Plain", "event_loop", False, error="bad", tokens_used=40)


def two_visits_interleaved(lg):
    # two executions of one logger run node "n" at once: complete, complete, then each's
    # fallback check
    for _ in range(2):
        lg.log_node_complete("n", "N", "event_loop", True, tokens_used=10, input_tokens=10)
    for _ in range(2):
        lg.ensure_node_logged("n", "N", "event_loop", True, tokens_used=10)


def a_logged_visit_then_a_fallback_only_visit(lg):
    # visit 1 logs itself; visit 2 (a feedback loop) does not: hive's fallback writes nothing
    # for a node it has an entry of
    lg.log_node_complete("n", "N", "event_loop", True, tokens_used=10)
    lg.ensure_node_logged("n", "N", "event_loop", True, tokens_used=10)
    lg.ensure_node_logged("n", "N", "event_loop", True, tokens_used=7)


def steps_of_a_retry_after_a_crash(lg):
    lg.log_step("fetch", "event_loop", 0, llm_text="first try", input_tokens=80)
    lg.ensure_node_logged("fetch", "Fetch", "event_loop", False, error="boom")
    lg.log_step("fetch", "event_loop", 0, llm_text="second try", input_tokens=40)
    lg.log_node_complete("fetch", "Fetch", "event_loop", True, tokens_used=50, input_tokens=40)
    lg.ensure_node_logged("fetch", "Fetch", "event_loop", True, tokens_used=50)


@pytest.mark.parametrize("calls", [
    retry_after_a_crash, fallback_then_a_visit_logging_itself, two_visits_interleaved,
    a_logged_visit_then_a_fallback_only_visit, steps_of_a_retry_after_a_crash,
], ids=lambda f: f.__name__)
def test_fallback_sequences_log_as_hives_logger(daemon, tmp_path, calls):
    """One thread's calls in hive's order log what hive's logger logs. The drop-in took a
    completion after a fallback entry for the fallback's own visit (it replaced it: a crashed
    attempt and its retry were one successful entry, without needs_attention, and the retry's
    step 0 replaced the crashed attempt's), and a fallback check after a completion's check for
    the start of a new visit (an entry hive does not write)."""
    got = side_by_side(daemon, tmp_path, calls)
    assert got["holdfast"] == got["hive"]


def test_concurrent_visits_log_one_entry_each_as_hives_logger(daemon, tmp_path):
    """8 threads x 30 visits (a completion, then the fallback check) over 4 nodes: 240 entries
    with either logger (the drop-in wrote 244: a fallback check after another thread's
    completion check wrote an entry)."""
    def calls(lg):
        def work(t):
            node = "n%d" % (t % 4)
            for _ in range(30):
                lg.log_node_complete(node, node, "event_loop", True, tokens_used=1,
                                     input_tokens=1)
                lg.ensure_node_logged(node, node, "event_loop", True, tokens_used=1)
        ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    got = side_by_side(daemon, tmp_path, calls)
    assert len(got["hive"][0]) == len(got["holdfast"][0]) == 240
    assert got["holdfast"][2] == got["hive"][2]


def test_a_fallback_and_a_completion_on_two_threads_are_one_entry_hive_writes_two(daemon,
                                                                                 tmp_path):
    """The one documented difference: the fallback check of a visit on one thread, then the
    node's completion on another (the race, here without timing luck): hive writes both entries
    (its race artefact), the drop-in one, the completion's. On one thread the same calls are a
    crashed attempt and its retry: two entries with both (test_fallback_sequences_...)."""
    def calls(lg):
        for f, args, kw in (
                (lg.ensure_node_logged, ("n", "N", "event_loop", True), {"tokens_used": 5}),
                (lg.log_node_complete, ("n", "N", "event_loop", True),
                 {"tokens_used": 5, "input_tokens": 3}),
                (lg.ensure_node_logged, ("n", "N", "event_loop", True), {"tokens_used": 5})):
            t = threading.Thread(target=f, args=args, kwargs=kw)
            t.start()
            t.join()

    got = side_by_side(daemon, tmp_path, calls)
    assert got["hive"][0] == [("n", True, None, 5, 0, False), ("n", True, None, 5, 3, False)]
    assert got["holdfast"][0] == [("n", True, None, 5, 3, False)]


def side_by_side_logger(name, tmp_path, agent_id, daemon):
    """hive's own logger ("hive") or the drop-in ("holdfast"), each over hive's
    `RuntimeLogStore` in its own directory under `tmp_path`, for the same calls; with that
    store, to read back what it wrote."""
    store = RuntimeLogStore(tmp_path / name / "runtime_logs")
    if name == "hive":
        return RuntimeLogger(store=store, agent_id=agent_id), store
    return (HoldfastRuntimeLogger(store=store, agent_id=agent_id, socket_path=daemon.socket),
            store)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def readers():
    return sum(1 for t in threading.enumerate() if t.name == "holdfast-client-reader")


def test_loggers_share_the_process_connection(daemon):
    """hive builds a RuntimeLogger per execution: each drop-in instance opened a connection of
    its own (a socket and a reader thread) and never closed it; 20 executions left 20 threads
    and 22 sockets open for the life of the process."""
    from holdfast_client.hive import close_shared_connections

    close_shared_connections()
    threads0, fds0 = readers(), open_fds()
    run_ids = []
    for i in range(20):
        lg = HoldfastRuntimeLogger(agent_id="exec-%d" % i, socket_path=daemon.socket)
        run_ids.append(lg.start_run(goal_id="g"))
        lg.log_node_complete("n", "N", "event_loop", True, input_tokens=i)
        asyncio.run(lg.end_run("success", duration_ms=1))
        del lg
    threads1, fds1 = readers(), open_fds()
    print("after 20 loggers: %+d reader threads, %+d open fds" % (threads1 - threads0,
                                                                    fds1 - fds0))
    assert threads1 - threads0 == 1, "one shared connection, one reader thread"
    assert fds1 - fds0 <= 1, "one socket (%d fds opened)" % (fds1 - fds0)
    with daemon.client("reader") as c:
        assert [c.run_get(r)["summary"]["total_input_tokens"] for r in run_ids] == \
            list(range(20))
    close_shared_connections()
    assert (readers(), open_fds()) == (threads0, fds0)
    # The next logger opens it again.
    lg = HoldfastRuntimeLogger(agent_id="again", socket_path=daemon.socket)
    lg.start_run(goal_id="g")
    assert readers() == threads0 + 1
    close_shared_connections()


def test_hive_reads_the_drop_ins_runs_in_its_current_layout_without_warnings(daemon, tmp_path):
    """The run files were in hive's deprecated runs/<id>/ layout only, which hive's
    RuntimeLogStore reads with a DeprecationWarning per call. Given hive's store (as hive's
    ExecutionManager gives it), the drop-in links the store's sessions/<id>/logs to the run:
    hive's own reader finds everything there, warnings turned into errors."""
    import warnings

    results = {}
    for name in ("hive", "holdfast"):
        old = os.umask(0o022)
        try:
            lg, store = side_by_side_logger(name, tmp_path, "agent-9", daemon)
            run_id = lg.start_run(goal_id="goal-1", session_id="session_20260101_000000_ab")
            assert (tmp_path / name / "sessions" / run_id / "logs").is_dir()
            lg.log_step("plan", "event_loop", 0, llm_text="thinking", input_tokens=3)
            lg.log_node_complete("plan", "Plan", "event_loop", True, tokens_used=5,
                                 input_tokens=3, output_tokens=2)
            asyncio.run(lg.end_run("success", duration_ms=7, node_path=["plan"]))
        finally:
            os.umask(old)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            summary = asyncio.run(store.load_summary(run_id))
            details = asyncio.run(store.load_details(run_id))
            steps = asyncio.run(store.load_tool_logs(run_id))
            listed = asyncio.run(store.list_runs())
        results[name] = (comparable(summary.model_dump()), entries(details.nodes),
                         [(s.node_id, s.step_index, s.llm_text) for s in steps.steps],
                         [r.run_id for r in listed])
        # hive's directories as hive makes them (0755 under umask 022).
        assert (tmp_path / name / "sessions").stat().st_mode & 0o777 == 0o755
    print("hive reads (warnings as errors): %s" % (results["holdfast"],))
    assert results["holdfast"] == results["hive"]


def test_a_grant_without_run_start_still_logs(make_daemon):
    """A plugin grant that lists its methods one by one, written before run.start existed: the
    logger still logs and ends its runs (run.start refused is a warning, not a failure)."""
    from holdfast_client import Client

    d = make_daemon(config='[plugins.old-agent]\nstores = []\nmethods = ["run.log_node", '
                           '"run.ensure_node", "run.log_step", "run.end", "run.get"]\n'
                           'runs = ["*"]\n')
    with Client(d.socket, plugin="old-agent") as c:
        lg = HoldfastRuntimeLogger(agent_id="old", client=c)
        run_id = lg.start_run(goal_id="g", session_id="old-grant-1")
        lg.log_node_complete("n", "N", "event_loop", True, input_tokens=4)
        asyncio.run(lg.end_run("success", duration_ms=1))
        assert c.run_get(run_id)["summary"]["total_input_tokens"] == 4


SESSION_WORKER = r"""
import asyncio, os, sys, time
from pathlib import Path
sys.path[:0] = %(paths)r
from framework.tracker.runtime_log_store import RuntimeLogStore
from framework.tracker.runtime_logger import RuntimeLogger
from holdfast_client.hive import HoldfastRuntimeLogger
kind, root, session, go, me = sys.argv[1:6]
store = RuntimeLogStore(Path(root))
if kind == "hive":
    lg = RuntimeLogger(store=store, agent_id=me)
else:
    lg = HoldfastRuntimeLogger(store=store, agent_id=me, socket_path=os.environ["SOCKET"])
lg.start_run("g", session_id=session)
open(go + "." + me, "w").close()  # started: both read the log before either writes
while not os.path.exists(go):
    time.sleep(0.001)
for visit in range(3):  # a node visited three times (a feedback loop), each logging a step
    lg.log_step("loop", "event_loop", 0, llm_text="%%s visit %%d" %% (me, visit), input_tokens=1)
    lg.log_node_complete("loop", "Loop", "event_loop", True, tokens_used=10, input_tokens=10)
    lg.ensure_node_logged("loop", "Loop", "event_loop", True, tokens_used=10)
lg.ensure_node_logged("once", "Once", "event_loop", True, tokens_used=1)
"""


def test_two_processes_logging_one_session_keep_every_visit_as_hives_appends(daemon, tmp_path):
    """Two processes logging the same hive session (each logger counting its own visits of a
    node): hive's appends keep all 6 visits and both processes' fallback entries; the drop-in
    kept half (each process's visit n had the same (node_id, attempt) key, so the second
    replaced or repeated the first)."""
    got = {}
    for kind in ("hive", "holdfast"):
        root = tmp_path / kind / "runtime_logs"
        session = "session_20260101_000000_two"
        go = tmp_path / (kind + ".go")
        script = SESSION_WORKER % {"paths": sys.path}
        env = dict(os.environ, SOCKET=daemon.socket)
        procs = [subprocess.Popen([sys.executable, "-c", script, kind, str(root), session,
                                   str(go), "p%d" % i], env=env) for i in range(2)]
        deadline = time.monotonic() + 60
        while not all(Path("%s.p%d" % (go, i)).exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        go.touch()
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        store = RuntimeLogStore(root)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nodes = asyncio.run(store.load_details(session)).nodes
            steps = asyncio.run(store.load_tool_logs(session)).steps
        got[kind] = (sorted((n.node_id, n.tokens_used) for n in nodes),
                     sorted(s.llm_text for s in steps))
        print("%-8s %d entries, %d steps" % (kind, len(nodes), len(steps)))
    assert got["holdfast"] == got["hive"]
    assert len(got["holdfast"][0]) == 8 and len(got["holdfast"][1]) == 6


def test_a_logger_goes_on_after_another_ended_the_session_as_hives(daemon, tmp_path):
    """Two loggers on one session (two processes, each an execution): B ends while A is still
    working. hive's A goes on appending and its end_run writes the summary of everything; the
    drop-in's A raised Conflict ("run has ended") into hive's executor on its next log call,
    and its visits and summary were lost."""
    got = {}
    for name in ("hive", "holdfast"):
        a, store = side_by_side_logger(name, tmp_path, "a", daemon)
        b, _ = side_by_side_logger(name, tmp_path, "b", daemon)
        session = "session_20260101_000000_ended"
        a.start_run("g", session_id=session)
        b.start_run("g", session_id=session)
        a.log_node_complete("x", "X", "event_loop", True, tokens_used=1, input_tokens=1)
        b.log_node_complete("y", "Y", "event_loop", True, tokens_used=2, input_tokens=2)
        asyncio.run(b.end_run("success", 1, ["y"]))
        a.log_step("x2", "event_loop", 0, llm_text="after the end", input_tokens=4)
        a.log_node_complete("x2", "X2", "event_loop", False, error="bad", tokens_used=4,
                            input_tokens=4)
        a.ensure_node_logged("x3", "X3", "event_loop", True, tokens_used=8)
        asyncio.run(a.end_run("failure", 2, ["x", "x2", "x3"]))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nodes = asyncio.run(store.load_details(session)).nodes
            summary = asyncio.run(store.load_summary(session))
        got[name] = (sorted((n.node_id, n.input_tokens) for n in nodes),
                     (summary.status, summary.total_nodes_executed, summary.total_input_tokens,
                      summary.node_path, summary.needs_attention))
        print(name, got[name])
    assert got["holdfast"] == got["hive"]
    assert got["holdfast"][1][:3] == ("failure", 4, 7)
