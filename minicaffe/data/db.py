"""Caffe's key-value databases, LMDB and LevelDB: open, read in key order, write.

Caffe's Data layer walks a database with a cursor from the first key to the last and wraps
around (``db_lmdb.cpp``, ``db_leveldb.cpp``); its tools write one ``Datum`` per key, keys
``%08d`` (``convert_mnist_data``) or ``%08d_<path>`` (``convert_imageset``), committing every
1,000 records.  Both databases keep keys in byte order, so "key order" is the order the tools
wrote them in.

=========  ===============================  =================================================
backend    on disk                          Python binding (an extra: ``minicaffe[data]``)
=========  ===============================  =================================================
LMDB       a directory: data.mdb, lock.mdb  ``lmdb`` (py-lmdb, wheels bundle liblmdb)
LEVELDB    a directory: CURRENT, MANIFEST-* ``plyvel`` (wheels bundle libleveldb)
=========  ===============================  =================================================

:func:`detect_backend` tells them apart by those files (so a prototxt's ``backend`` field
need not be right); :func:`open_db` returns a :class:`DB` with ``len()``, ``keys`` (all keys, in
order, read once when opened: the one pass that random access for shuffling needs) and
``get(key)``.  Readers open LMDB read-only without its lock file (``MDB_RDONLY | MDB_NOTLS`` as
Caffe, plus ``lock=False``), so a database on a read-only disk works; every ``get`` uses its own
short read transaction, so the prefetch thread and the caller may read at once.
"""

import atexit
import os
import threading
from pathlib import Path

from ._util import DatasetError

LMDB_HINT = "reading/writing LMDB needs the lmdb package: pip install lmdb (or pip install 'minicaffe[data]')"
LEVELDB_HINT = "reading/writing LevelDB needs the plyvel package: pip install plyvel (or pip install 'minicaffe[data]')"
# Caffe's LMDB map size (db_lmdb.hpp grows it on demand; a sparse file, so 1 TB costs nothing)
LMDB_MAP_SIZE = 1 << 40


def _lmdb():
    try:
        import lmdb
    except ImportError:
        raise DatasetError(LMDB_HINT) from None
    return lmdb


def _plyvel():
    try:
        import plyvel
    except ImportError:
        raise DatasetError(LEVELDB_HINT) from None
    return plyvel


def _text(error):
    """An exception's message as text (plyvel's are bytes)."""
    arg = error.args[0] if error.args else error
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def detect_backend(path):
    """ "LMDB", "LEVELDB" or None (not a database) for a path, from the files in it."""
    p = Path(path)
    if p.is_dir():
        if (p / "data.mdb").is_file():
            return "LMDB"
        if (p / "CURRENT").is_file() and any(p.glob("MANIFEST-*")):
            return "LEVELDB"
        return None
    if p.is_file() and p.suffix == ".mdb":  # an LMDB opened with MDB_NOSUBDIR
        return "LMDB"
    return None


def fingerprint(path):
    """What changes when a database at ``path`` is written or re-created (for caches of its key
    list): the size, time and inode of LMDB's data.mdb, or of LevelDB's CURRENT and its directory."""
    p = Path(path)
    files = [p / "data.mdb"] if (p / "data.mdb").is_file() else [p / "CURRENT", p] if p.is_dir() else [p]
    stats = [f.stat() for f in files if f.exists()]
    manifests = sorted(m.name for m in p.glob("MANIFEST-*")) if p.is_dir() else []
    return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats) + tuple(manifests)


class DB:
    """A read-only view of one database: ``len(db)``, ``db.keys`` (list of bytes), ``db.get(key)``."""

    backend = None

    def __init__(self, path):
        self.path = str(path)
        self.keys = []

    def __len__(self):
        return len(self.keys)

    def get(self, key):
        raise NotImplementedError

    def close(self):
        pass

    def where(self, key):
        """How an error names a record: the database and the key."""
        return f"{self.backend} database '{self.path}', key '{key.decode('utf-8', 'replace')}'"


_envs = {}  # (real path, inode of data.mdb) -> open read-only lmdb.Environment
_envs_lock = threading.Lock()
_leveldbs = {}  # (real path, inode) -> open plyvel.DB


@atexit.register
def _close_leveldbs():
    """Close and drop the shared LevelDB handles while the interpreter is whole: a plyvel handle
    still alive when modules are torn down fails there ("Error in sys.excepthook" at exit)."""
    with _envs_lock:
        for db in _leveldbs.values():
            db.close()
        _leveldbs.clear()


def _shared_env(path):
    """One read-only environment per database file and process: LMDB forbids opening the same
    environment twice in a process (py-lmdb refuses), and a train and a test net, or a tool and
    a net, may read the same database."""
    lmdb = _lmdb()
    subdir = os.path.isdir(path)
    data = os.path.join(path, "data.mdb") if subdir else path
    key = (os.path.realpath(data), os.stat(data).st_ino)
    with _envs_lock:
        if key not in _envs:
            _envs[key] = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=subdir, max_readers=512)
        return _envs[key]


class LMDBReader(DB):
    backend = "LMDB"

    def __init__(self, path):
        super().__init__(path)
        lmdb = _lmdb()
        try:
            self.env = _shared_env(self.path)
            self._check_size()
            with self.env.begin(buffers=False) as txn:
                self.keys = list(txn.cursor().iternext(keys=True, values=False))
        except lmdb.Error as e:
            raise DatasetError(
                f"LMDB database '{self.path}' cannot be read: {e} (a corrupt or unfinished database?)"
            ) from None

    def _check_size(self):
        """A truncated data.mdb (a half-finished copy) would crash the process (SIGBUS) when a page
        past its end is read through the memory map: refuse it here, from the meta page's last page."""
        data = os.path.join(self.path, "data.mdb") if os.path.isdir(self.path) else self.path
        need = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        have = os.path.getsize(data)
        if have < need:
            raise DatasetError(
                f"LMDB database '{self.path}' is truncated: its pages need {need} bytes, data.mdb has {have} "
                f"(an unfinished copy?)"
            )

    def get(self, key):
        lmdb = _lmdb()
        try:
            with self.env.begin(buffers=False) as txn:
                value = txn.get(key)
        except lmdb.Error as e:
            raise DatasetError(f"{self.where(key)}: cannot be read: {e}") from None
        if value is None:
            raise DatasetError(f"{self.where(key)}: the record is gone (was the database changed while open?)")
        return value


class LevelDBReader(DB):
    backend = "LEVELDB"

    def __init__(self, path):
        super().__init__(path)
        plyvel = _plyvel()
        try:
            self.handle = (os.path.realpath(self.path), os.stat(self.path).st_ino)  # re-created: a new handle
            with _envs_lock:  # LevelDB locks its directory: one handle per process, shared
                if self.handle not in _leveldbs or _leveldbs[self.handle].closed:
                    # an absolute path: LevelDB's in-process lock table is keyed by the path string
                    _leveldbs[self.handle] = plyvel.DB(
                        os.path.abspath(self.path), create_if_missing=False, max_open_files=100
                    )
            self.keys = list(self.db.iterator(include_value=False))
        except plyvel.Error as e:
            raise DatasetError(
                f"LevelDB database '{self.path}' cannot be read: {_text(e)} "
                + (
                    "(another process has it open: LevelDB allows one process at a time, in Caffe too; "
                    "convert to LMDB, which any number of readers share)"
                    if "/LOCK" in _text(e)
                    else "(a corrupt database?)"
                )
            ) from None

    @property
    def db(self):
        """The shared plyvel handle (looked up, not held: :func:`_close_leveldbs` frees it at exit)."""
        return _leveldbs[self.handle]

    def get(self, key):
        plyvel = _plyvel()
        try:
            value = self.db.get(key)
        except plyvel.Error as e:
            raise DatasetError(f"{self.where(key)}: cannot be read: {_text(e)}") from None
        if value is None:
            raise DatasetError(f"{self.where(key)}: the record is gone (was the database changed while open?)")
        return value


def open_db(path, backend=None):
    """A :class:`DB` for the database at ``path`` (backend detected from the files when None)."""
    found = detect_backend(path)
    if found is None:
        if backend is None:
            raise DatasetError(f"'{path}' is not an LMDB or LevelDB database (no data.mdb, no CURRENT + MANIFEST)")
        found = backend
    db = LMDBReader(path) if found == "LMDB" else LevelDBReader(path)
    if not len(db):
        raise DatasetError(f"{found} database '{path}' is empty")
    return db


class Writer:
    """Write records into a new database, committed every ``commit_every`` puts (Caffe: 1000).

    ``with Writer(path, "LMDB") as w: w.put(key, value)``.  As Caffe's ``db::NEW``, the
    database must not exist yet (LMDB: the directory is created; an existing one is an error).
    """

    def __init__(self, path, backend="LMDB", commit_every=1000):
        self.path, self.backend, self.commit_every = str(path), backend.upper(), int(commit_every)
        if self.backend not in ("LMDB", "LEVELDB"):
            raise DatasetError(f"unknown database backend '{backend}' (lmdb or leveldb)")
        if os.path.exists(self.path):
            raise DatasetError(f"'{self.path}' exists already; remove it first (Caffe's tools refuse too)")
        self.pending = []
        self.count = 0
        if self.backend == "LMDB":
            lmdb = _lmdb()
            os.makedirs(self.path)
            self.env = lmdb.open(self.path, map_size=LMDB_MAP_SIZE, subdir=True, meminit=False)
        else:
            plyvel = _plyvel()
            # Caffe's db_leveldb.cpp options
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self.db = plyvel.DB(
                os.path.abspath(self.path),  # LevelDB's in-process lock table is keyed by the path string
                create_if_missing=True,
                error_if_exists=True,
                block_size=65536,
                write_buffer_size=268435456,
                max_open_files=100,
            )

    def put(self, key, value):
        self.pending.append((key.encode() if isinstance(key, str) else bytes(key), bytes(value)))
        self.count += 1
        if len(self.pending) >= self.commit_every:
            self.commit()

    def commit(self):
        if not self.pending:
            return
        if self.backend == "LMDB":
            with self.env.begin(write=True) as txn:
                for k, v in self.pending:
                    txn.put(k, v)
        else:
            with self.db.write_batch() as batch:
                for k, v in self.pending:
                    batch.put(k, v)
        self.pending = []

    def close(self):
        self.commit()
        if self.backend == "LMDB":
            self.env.close()
        else:
            self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # an unfinished database is closed as it is (Caffe leaves it too)
            self.pending = []
            self.close()
