#!/usr/bin/env python3
"""A stand-in for hive's ``EncryptedFileStorage``, for holdfast's interop tests.

It reads and writes the layout described in ``HIVE-FORMAT.md`` the way hive does:

* ``credentials/<safe_id>.enc``: one Fernet token (Python ``cryptography``, as hive uses),
  no trailing newline, written in place (truncate, then write) like hive's ``save``;
* plaintext: ``json.dumps`` with Python's default separators and ``ensure_ascii``, fields in
  hive's order, datetimes as pydantic writes them (``...Z``, six fraction digits when non-zero);
* ``metadata/index.json`` version 2.0, datetimes in ``isoformat()`` form (``+00:00``), entries
  derived as hive derives them (provider, alias, identity, key_names, expires_at);
* the key from ``--key-file``, else ``HIVE_CREDENTIAL_KEY``, else
  ``$HIVE_HOME/secrets/credential_key`` (surrounding whitespace stripped).

One deliberate difference: with no key, hive mints a new random key (and loses every existing
credential); this stand-in refuses instead, so a test can never pass on a key it made up.
Directories are created 0700 and files 0600 (umask 077), which a holdfast store requires.

Only the standard library and ``cryptography`` are used. Subcommands print JSON on stdout and
exit non-zero with a message on stderr when anything is wrong.

Regenerating the committed fixture (from the repository root)::

    rm -rf tests/fixtures/hive_store_v2 tests/fixtures/hive_store_v2.key
    python3 tests/python/hive_store.py genkey tests/fixtures/hive_store_v2.key
    python3 tests/python/hive_store.py --key-file tests/fixtures/hive_store_v2.key \\
        write tests/fixtures/hive_store_v2 --bulk 5 --bom-id legacy/bom \\
        --expected tests/fixtures/hive_store_v2/expected.json
"""

import argparse
import datetime as dt
import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

KNOWN_TYPES = ("api_key", "oauth2", "basic_auth", "bearer_token", "custom")
META_KEYS = ("_alias", "_integration_type")
IDENTITY_PREFIX = "_identity_"
IDENTITY_FIELDS = ("email", "username", "workspace", "account_id")
INDEX_VERSION = "2.0"
# The forms hive (pydantic for credential files, isoformat for the index) writes.
DT_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?(Z|[+-]\d\d:\d\d)?$")
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)


class Failure(Exception):
    """Something a test must hear about (exit status 1, message on stderr)."""


# --- hive's naming, time formats and key lookup -------------------------------------------


def safe_id(cid):
    """hive's file stem: the replacements in this order."""
    return cid.replace("/", "_").replace("\\", "_").replace("..", "_")


def file_name(cid):
    return safe_id(cid) + ".enc"


def fmt_cred_dt(d):
    """pydantic's JSON form: UTC as ``Z``, other offsets as ``+HH:MM``, naive bare."""
    if d is None:
        return None
    s = d.isoformat()
    if d.utcoffset() == dt.timedelta(0) and s.endswith("+00:00"):
        s = s[: -len("+00:00")] + "Z"
    return s


def parse_dt(s):
    """Parse a hive datetime string (``Z``, offset or naive); Failure if it is not one."""
    if not isinstance(s, str) or not DT_RE.match(s):
        raise Failure("not a datetime in hive's form: %r" % (s,))
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    return dt.datetime.fromisoformat(s)


def index_dt(s):
    """A credential-file datetime in the index's form (Python ``isoformat()``)."""
    return None if s is None else parse_dt(s).isoformat()


def load_key(args):
    if args.key_file:
        text = Path(args.key_file).read_text(encoding="utf-8")
    elif os.environ.get("HIVE_CREDENTIAL_KEY"):
        text = os.environ["HIVE_CREDENTIAL_KEY"]
    else:
        home = Path(os.environ.get("HIVE_HOME") or Path.home() / ".hive")
        path = home / "secrets" / "credential_key"
        if not path.exists():
            raise Failure("no key: pass --key-file, set HIVE_CREDENTIAL_KEY or create %s" % path)
        text = path.read_text(encoding="utf-8")
    return Fernet(text.strip().encode("ascii"))


# --- documents ---------------------------------------------------------------------------


def key_doc(name, value, expires_at=None, metadata=None, **extras):
    d = {"name": name, "value": value, "expires_at": fmt_cred_dt(expires_at),
         "metadata": metadata if metadata is not None else {}}
    d.update(extras)
    return d


def cred_doc(cid, ctype, keys, provider_id=None, last_refreshed=None, auto_refresh=False,
             last_used=None, use_count=0, description="", tags=None, created_at=T0,
             updated_at=T0, **extras):
    """A credential in hive's field order (pydantic ``model_dump(mode="json")``)."""
    d = {
        "id": cid,
        "credential_type": ctype,
        "keys": {k["name"]: k for k in keys},
        "provider_id": provider_id,
        "last_refreshed": fmt_cred_dt(last_refreshed),
        "auto_refresh": auto_refresh,
        "last_used": fmt_cred_dt(last_used),
        "use_count": use_count,
        "description": description,
        "tags": tags if tags is not None else [],
        "created_at": fmt_cred_dt(created_at),
        "updated_at": fmt_cred_dt(updated_at),
    }
    d.update(extras)
    return d


def sample_credentials(bulk):
    """The credentials `write` stores: every shape hive has, plus `bulk` plain api keys."""
    plus2 = dt.timezone(dt.timedelta(hours=2))
    creds = [
        cred_doc("openai", "api_key", [key_doc("api_key", "sk-test-openai-0001")],
                 description="OpenAI key for the summarizer"),
        cred_doc(
            "team/github", "oauth2",
            [
                key_doc("access_token", "gho-test-access-0002",
                        expires_at=dt.datetime(2026, 5, 1, tzinfo=UTC)),
                key_doc("refresh_token", "ghr-test-refresh-0003",
                        expires_at=dt.datetime(2026, 4, 1, 12, 30, 0, 120000, tzinfo=UTC),
                        metadata={"scopes": ["repo", "read:org"]}),
                key_doc("_alias", "work"),
                key_doc("_integration_type", "github"),
                key_doc("_identity_email", "dev@example.com"),
                key_doc("_identity_username", ""),
                key_doc("_identity_workspace", "acme"),
            ],
            provider_id="github", auto_refresh=True,
            last_refreshed=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=plus2),
            last_used=dt.datetime(2026, 1, 3, 0, 0, 1, 500000, tzinfo=UTC), use_count=7,
            description="GitHub OAuth — équipe «core» 🚀", tags=["vcs", "team"],
            created_at=dt.datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC),
            updated_at=dt.datetime(2026, 1, 2, 1, 4, 5, 1, tzinfo=UTC)),
        cred_doc(
            "db/prod/main", "basic_auth",
            [
                key_doc("username", "svc_holdfast", rotation_hint="quarterly"),
                key_doc("password", "p@ss \"quoted\"\\ line\nsecond ✓",
                        metadata={"source": "vault"}, scopes=["read", "write"],
                        future_key_field={"nested": [1, 2.5, None, True]}),
            ],
            description="Primary database", tags=["db"],
            hive_future_field={"nested": [1, 2, {"deep": "ü"}]}, owner_team="infra",
            schema_revision=3),
        cred_doc("legacy_bearer", "bearer_token", [key_doc("token", "bt-test-0004")],
                 last_used=dt.datetime(2026, 1, 5, 8, 0, 0)),  # naive, as old hive wrote
        cred_doc("café/naïve-ключ", "custom",
                 [key_doc("blob", "значение-🔑-0005"), key_doc("_alias", "unicode")],
                 description="non-ASCII id and values"),
        cred_doc("a..b", "api_key", [key_doc("api_key", "sk-test-dots-0006")]),
        cred_doc("empty/keys", "custom", []),
        cred_doc("legacy/bom", "api_key", [key_doc("api_key", "sk-test-bom-0007")],
                 description="written with a UTF-8 BOM when --bom-id legacy/bom"),
    ]
    for i in range(bulk):
        # HIVE-FORMAT.md's example, verbatim in shape.
        creds.append(cred_doc("cred_%05d" % i, "api_key",
                              [key_doc("api_key", "sk-test-%05d" % i)]))
    return creds


def check_cred(doc, where):
    """Validate a plaintext document as hive's pydantic model would (stricter on formats)."""
    def bad(msg):
        raise Failure("%s: %s" % (where, msg))

    if not isinstance(doc, dict):
        bad("not a JSON object")
    if not isinstance(doc.get("id"), str) or not doc["id"]:
        bad("missing string id")
    ctype = doc.get("credential_type", "api_key")
    if ctype not in KNOWN_TYPES:
        bad("unknown credential_type %r" % (ctype,))
    keys = doc.get("keys", {})
    if not isinstance(keys, dict):
        bad("keys is not an object")
    for name, k in keys.items():
        if not isinstance(k, dict):
            bad("key %r is not an object" % name)
        if not isinstance(k.get("name"), str) or not isinstance(k.get("value"), str):
            bad("key %r lacks string name/value" % name)
        if k["name"] != name:
            bad("key %r is named %r inside" % (name, k["name"]))
        if k.get("expires_at") is not None:
            try:
                parse_dt(k["expires_at"])
            except Failure as e:
                bad("key %r expires_at: %s" % (name, e))
        if not isinstance(k.get("metadata", {}), dict):
            bad("key %r metadata is not an object" % name)
    for f in ("last_refreshed", "last_used", "created_at", "updated_at"):
        if doc.get(f) is not None:
            try:
                parse_dt(doc[f])
            except Failure as e:
                bad("%s: %s" % (f, e))
    checks = [("provider_id", (str, type(None))), ("auto_refresh", bool),
              ("description", str), ("tags", list)]
    for f, types in checks:
        if f in doc and not isinstance(doc[f], types):
            bad("%s has the wrong type" % f)
    if "use_count" in doc and (not isinstance(doc["use_count"], int)
                               or isinstance(doc["use_count"], bool)):
        bad("use_count is not an integer")
    if not all(isinstance(t, str) for t in doc.get("tags", [])):
        bad("tags are not strings")


def index_entry(doc):
    """hive's index entry for a credential (no secret values)."""
    keys = doc.get("keys") or {}

    def value(name):
        k = keys.get(name)
        return k.get("value") if k else None

    identity = {}
    for f in IDENTITY_FIELDS:
        v = value(IDENTITY_PREFIX + f)
        if v:
            identity[f] = v
    expiries = [parse_dt(k["expires_at"]) for k in keys.values() if k.get("expires_at")]
    return {
        "credential_type": doc.get("credential_type"),
        "provider": value("_integration_type"),
        "alias": value("_alias"),
        "identity": identity,
        "key_names": sorted(n for n in keys
                            if n not in META_KEYS and not n.startswith(IDENTITY_PREFIX)),
        "created_at": index_dt(doc.get("created_at")),
        "updated_at": index_dt(doc.get("updated_at")),
        "last_refreshed": index_dt(doc.get("last_refreshed")),
        "expires_at": min(expiries).isoformat() if expiries else None,
        "auto_refresh": doc.get("auto_refresh", False),
        "tags": doc.get("tags", []),
    }


# --- the store ---------------------------------------------------------------------------


class Store:
    """hive's EncryptedFileStorage, minus the key minting."""

    def __init__(self, base, fernet):
        self.base = Path(base)
        self.cred_dir = self.base / "credentials"
        self.meta_dir = self.base / "metadata"
        self.index_path = self.meta_dir / "index.json"
        self.lock_path = self.meta_dir / "index.lock"
        self.fernet = fernet

    def ensure_dirs(self):
        for d in (self.base, self.cred_dir, self.meta_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    def enc_files(self):
        if not self.cred_dir.is_dir():
            return []
        return sorted(p for p in self.cred_dir.iterdir()
                      if p.name.endswith(".enc") and p.is_file())

    def token_for(self, doc, bom=False, at=None):
        data = json.dumps(doc).encode("utf-8")  # default separators, ensure_ascii
        if bom:
            data = b"\xef\xbb\xbf" + data
        if at is None:
            return self.fernet.encrypt(data)
        return self.fernet.encrypt_at_time(data, int(at))

    def write_file_inplace(self, cid, token):
        """hive's save: open("wb") truncates, then writes (a crash in between tears it)."""
        with open(self.cred_dir / file_name(cid), "wb") as f:
            f.write(token)

    def decrypt(self, path):
        token = path.read_bytes()
        try:
            plain = self.fernet.decrypt(token.strip())
        except InvalidToken:
            raise Failure("%s: does not decrypt with the key" % path.name)
        try:
            doc = json.loads(plain.decode("utf-8-sig"))
        except ValueError as e:
            raise Failure("%s: plaintext is not JSON: %s" % (path.name, e))
        check_cred(doc, path.name)
        return doc

    def load_credential(self, cid):
        return self.decrypt(self.cred_dir / file_name(cid))

    def scan(self, skip_unreadable=False, skip_empty=False):
        """Every credential on disk: {id: doc}. The file name must be the id's safe name.
        With skip_empty, an empty file (a write in place not made yet, or never) is passed by."""
        out = {}
        for p in self.enc_files():
            if skip_empty and p.stat().st_size == 0:
                continue
            try:
                doc = self.decrypt(p)
            except Failure:
                if skip_unreadable:
                    continue
                raise
            if file_name(doc["id"]) != p.name:
                raise Failure("%s holds id %r, whose file would be %s"
                              % (p.name, doc["id"], file_name(doc["id"])))
            if doc["id"] in out:
                raise Failure("id %r appears twice" % doc["id"])
            out[doc["id"]] = doc
        return out

    def new_index(self):
        return {"credentials": {}, "version": INDEX_VERSION, "store_path": str(self.base),
                "generated_at": dt.datetime.now(UTC).isoformat()}

    def load_index(self):
        """hive's loader: (index, rebuilt). Missing, unparseable or not 2.0 -> rebuild."""
        try:
            with open(self.index_path, "r", encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict) and data.get("version") == INDEX_VERSION \
                    and isinstance(data.get("credentials"), dict):
                return data, False
        except (OSError, ValueError):
            pass
        index = self.new_index()
        for cid, doc in self.scan(skip_unreadable=True).items():
            index["credentials"][cid] = index_entry(doc)
        return index, True

    def save_index(self, index):
        """hive's index write: in place, indent=2."""
        index["generated_at"] = dt.datetime.now(UTC).isoformat()
        with open(self.index_path, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)

    def update_index(self, cid, doc, hold=0.0):
        index, _ = self.load_index()
        index["credentials"][cid] = index_entry(doc)
        if hold:
            time.sleep(hold)  # a slow read-modify-write (hive's is O(n) in the index size)
        self.save_index(index)

    def save(self, doc, bom=False):
        """hive's save_credential (unpatched): file in place, then index read-modify-write."""
        self.write_file_inplace(doc["id"], self.token_for(doc, bom=bom))
        self.update_index(doc["id"], doc)


# --- subcommands -------------------------------------------------------------------------


def cmd_genkey(args):
    path = Path(args.path)
    if path.exists():
        raise Failure("%s exists; not replacing a key" % path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(Fernet.generate_key())
    return {"created": str(path)}


def cmd_write(args):
    store = Store(args.store_dir, load_key(args))
    if store.enc_files():
        raise Failure("%s already holds credentials; write wants a fresh store" % store.base)
    store.ensure_dirs()
    expected = {}
    docs = sample_credentials(args.bulk)
    unknown = set(args.bom_id) - {d["id"] for d in docs}
    if unknown:
        raise Failure("--bom-id names ids write does not write: %s" % sorted(unknown))
    for doc in docs:
        store.save(doc, bom=(doc["id"] in args.bom_id))
        expected[doc["id"]] = doc
    if args.expected:
        with open(args.expected, "w", encoding="utf-8") as f:
            json.dump(expected, f, indent=2, ensure_ascii=False, sort_keys=False)
            f.write("\n")
    return expected


def cmd_read(args):
    return Store(args.store_dir, load_key(args)).scan(skip_empty=args.skip_empty)


def cmd_list(args):
    """hive's list_all (the index's ids) plus a check of every entry against the files."""
    store = Store(args.store_dir, load_key(args))
    index, rebuilt = store.load_index()
    # An empty file holds no credential (a write in place not made yet, or never).
    on_disk = store.scan(skip_empty=True)
    problems = []
    for f in ("store_path", "generated_at"):
        if not isinstance(index.get(f), str):
            problems.append("index field %s missing or not a string" % f)
    if isinstance(index.get("generated_at"), str) and not DT_RE.match(index["generated_at"]):
        problems.append("generated_at %r is not isoformat" % index["generated_at"])
    for cid, entry in index["credentials"].items():
        doc = on_disk.get(cid)
        if doc is None:
            problems.append("ghost: %r is in the index but has no file" % cid)
            continue
        want = index_entry(doc)
        for field, v in want.items():
            if not isinstance(entry, dict) or entry.get(field, "<missing>") != v:
                got = entry.get(field, "<missing>") if isinstance(entry, dict) else entry
                problems.append("%r: index %s is %r, hive derives %r" % (cid, field, got, v))
    for cid in on_disk:
        if cid not in index["credentials"]:
            problems.append("missing: %r is on disk but not in the index" % cid)
    return {"ids": sorted(index["credentials"]), "index_usable": not rebuilt,
            "version": index.get("version"), "problems": problems}


def cmd_break_index(args):
    store = Store(args.store_dir, None)
    path = store.index_path
    mode = args.mode
    if mode == "missing":
        path.unlink()
        return {"mode": mode}
    raw = path.read_bytes()
    if mode == "torn":
        with open(path, "wb") as f:  # truncated mid-write, as a crash leaves it
            f.write(raw[: len(raw) // 2])
        return {"mode": mode, "kept_bytes": len(raw) // 2}
    index = json.loads(raw)
    if mode == "v1":
        index["version"] = "1.0"
        dropped = []
    elif mode == "drop-most":
        # What 2-4 unlocked writers leave: each rewrote the index from its own stale copy.
        ids = sorted(index["credentials"])
        keep = set(ids[:: 10])
        dropped = [i for i in ids if i not in keep]
        for i in dropped:
            del index["credentials"][i]
    elif mode == "ghost":
        # hive's delete unlinks the file first; a crash before the index update leaves these.
        dropped = []
        for gid in ("ghost/deleted-1", "ghost_deleted_2"):
            index["credentials"][gid] = index_entry(cred_doc(gid, "api_key", [
                key_doc("api_key", "gone")]))
    else:
        raise Failure("unknown mode %r" % mode)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    return {"mode": mode, "dropped": dropped,
            "index_ids": sorted(index["credentials"])}


def cmd_write_inplace(args):
    """hive's truncate-then-write, "crashing" after `keep_bytes` bytes of the new token."""
    store = Store(args.store_dir, load_key(args))
    doc = store.load_credential(args.id)
    doc["use_count"] = doc.get("use_count", 0) + 1
    token = store.token_for(doc)
    keep = min(args.keep_bytes, len(token) - 1)
    with open(store.cred_dir / file_name(args.id), "wb") as f:
        f.write(token[:keep])
    return {"id": args.id, "file": file_name(args.id), "bytes": keep}


def cmd_write_future(args):
    """One credential whose token is stamped `ahead` seconds in the future (clock skew)."""
    store = Store(args.store_dir, load_key(args))
    store.ensure_dirs()
    doc = cred_doc(args.id, "api_key", [key_doc("api_key", "sk-test-future")])
    store.write_file_inplace(args.id, store.token_for(doc, at=time.time() + args.ahead))
    store.update_index(args.id, doc)
    return {"id": args.id, "file": file_name(args.id)}


def wait_for(path, what):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise Failure("no %s signal (%s) within 60 s" % (what, path))
        time.sleep(0.001)


def cmd_lock_writer(args):
    """hive's patched writer: flock(LOCK_EX) on metadata/index.lock around each index
    read-modify-write (the credential file itself is still written in place, as hive does).

    With --tail N, the last N ids wait for --tail-go-file, so a test can make these writers
    the last to touch index.json."""
    store = Store(args.store_dir, load_key(args))
    store.ensure_dirs()
    print("ready", flush=True)
    if args.go_file:
        wait_for(args.go_file, "go")
    ids = []
    times = {"start": time.time()}
    lock_fd = os.open(store.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for i in range(args.count):
            if i == args.count - args.tail and args.tail_go_file:
                times["head_end"] = time.time()
                wait_for(args.tail_go_file, "tail-go")
                times["tail_start"] = time.time()
            cid = "%s/cred_%04d" % (args.prefix, i)
            now = dt.datetime.now(UTC)
            doc = cred_doc(cid, "api_key", [key_doc("api_key", "sk-%s-%04d" % (args.prefix, i))],
                           created_at=now, updated_at=now)
            store.write_file_inplace(cid, store.token_for(doc))
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                store.update_index(cid, doc, hold=args.hold_ms / 1000.0)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
            ids.append(cid)
    finally:
        os.close(lock_fd)
    times["end"] = time.time()
    return {"written": ids, "times": times}


def main(argv=None):
    os.umask(0o077)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key-file", help="key file (else HIVE_CREDENTIAL_KEY, else hive's file)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("genkey", help="create a new key file (0600)")
    s.add_argument("path")
    s = sub.add_parser("write", help="write the sample credentials into a fresh store")
    s.add_argument("store_dir")
    s.add_argument("--bulk", type=int, default=0, help="also write N plain api_key credentials")
    s.add_argument("--bom-id", action="append", default=[],
                   help="write this id's plaintext with a UTF-8 BOM (hive reads utf-8-sig)")
    s.add_argument("--expected", help="also write the documents to this JSON file")
    s = sub.add_parser("read", help="decrypt and validate every .enc, print {id: doc}")
    s.add_argument("store_dir")
    s.add_argument("--skip-empty", action="store_true",
                   help="pass by empty files (a write in place that holdfast leaves alone)")
    s = sub.add_parser("list", help="hive's list_all (index ids) and index checks")
    s.add_argument("store_dir")
    s = sub.add_parser("break-index", help="damage index.json as unpatched hive does")
    s.add_argument("store_dir")
    s.add_argument("mode", choices=["drop-most", "torn", "v1", "missing", "ghost"])
    s = sub.add_parser("write-inplace", help="truncate-then-write one credential, then 'crash'")
    s.add_argument("store_dir")
    s.add_argument("id")
    s.add_argument("--keep-bytes", type=int, default=0)
    s = sub.add_parser("write-future", help="write a token stamped in the future")
    s.add_argument("store_dir")
    s.add_argument("id")
    s.add_argument("--ahead", type=int, default=3600)
    s = sub.add_parser("lock-writer", help="write N credentials as hive's patched writer")
    s.add_argument("store_dir")
    s.add_argument("--prefix", required=True)
    s.add_argument("--count", type=int, default=100)
    s.add_argument("--go-file", help="print 'ready', then wait for this file to exist")
    s.add_argument("--tail", type=int, default=0, help="hold back the last N ids ...")
    s.add_argument("--tail-go-file", help="... until this file exists")
    s.add_argument("--hold-ms", type=float, default=0.0,
                   help="pause between loading and saving the index (widens the race window)")
    args = p.parse_args(argv)
    handler = {"genkey": cmd_genkey, "write": cmd_write, "read": cmd_read, "list": cmd_list,
               "break-index": cmd_break_index, "write-inplace": cmd_write_inplace,
               "write-future": cmd_write_future, "lock-writer": cmd_lock_writer}[args.cmd]
    try:
        result = handler(args)
    except Failure as e:
        print("hive_store: %s" % e, file=sys.stderr)
        return 1
    # ASCII-escaped, so the output does not depend on the locale's stdout encoding.
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
