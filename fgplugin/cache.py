"""On-disk cache of preprocessing results, written atomically and checked on load.

An entry is one file: a fixed header line with the payload's SHA-256 and length, then the
payload (``torch.save`` of the object). It is written to a temporary file in the same folder and
moved into place with ``os.replace``, so a crash mid-write never leaves a half entry under the
real name. On load, a header that is not ours, a wrong checksum or length (a corrupt or truncated
file), a key that does not match (a file renamed or copied over) or a payload that does not load
is reported with a warning, removed and rebuilt. A file's name is its key, and the key covers the
format of what is cached (fgplugin.preprocess.CACHE_FORMAT): entries of an older format sit under
other names and are never read; delete the folder to reclaim their space. Temporary files left by
a process killed mid-write are removed by the next write to the folder once an hour old.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from .config import cache_dir

FORMAT = "fgplugin-cache-v1"


class CacheWarning(UserWarning):
    """A cache entry was unusable (corrupt, truncated or stale) and has been rebuilt, or the cache
    folder could not be used."""


def default_cache_dir() -> Path:
    return cache_dir() / "preprocess"


def tensor_digest(*parts: Any) -> str:
    """A hex key over tensors (their dtype, shape and bytes) and plain values (their repr)."""
    # SHA-256 over the tensors' own buffers: hashlib reads them in place (no bytes copy), and with
    # the CPU's SHA extensions it runs at about twice blake2b's speed (the key of a 100M-edge
    # graph hashes 1.7 GB on every load).
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            data = part.detach().contiguous().cpu()
            digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
            if data.numel():
                digest.update(data.reshape(-1).view(torch.uint8).numpy())
        else:
            digest.update(repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _header(payload: bytes, key: str) -> bytes:
    return f"{FORMAT} {key} {hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()


def save_entry(path: Path, key: str, obj: Any) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_writes(path.parent)
    write_atomically(path, _header(payload, key), payload)


def write_atomically(path: Path, *chunks: bytes, private: bool = True) -> None:
    """Writes ``chunks`` to ``path`` through a temporary file in its folder, flushed to disk and
    moved into place with ``os.replace`` (the folder synced after): a crash leaves the old file or
    the new one, never a torn one. The temporary file is removed when the write fails.
    ``private``: readable by its owner only (the temporary file's mode); else the mode the umask
    gives a new file, as ``open`` would."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        if not private:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself reaches the disk with the folder's entry
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened for reading (or a platform without it)
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


ABANDONED_AFTER_S = 3600  # a temporary file this old is no write in progress: a killed process's


def _remove_abandoned_writes(folder: Path) -> None:
    now = time.time()
    for tmp in folder.glob("*.pt*.tmp"):
        try:
            if now - tmp.stat().st_mtime > ABANDONED_AFTER_S:
                tmp.unlink()
        except OSError:  # gone meanwhile, or not ours to remove
            pass


def load_entry(path: Path, key: str) -> Any | None:
    """The cached object, or None when absent; an unusable entry warns and is removed."""
    try:
        with open(path, "rb") as f:
            header = f.readline(256)  # the header is one short line; a longer one is not ours
            payload = f.read()  # one copy: io.BytesIO below shares an immutable bytes object
    except FileNotFoundError:
        return None
    fields = header.rstrip(b"\n").decode(errors="replace").split(" ")
    if len(fields) != 4 or fields[0] != FORMAT:
        problem = "corrupt (no fgplugin cache header) or written by another fgplugin version"
    elif fields[1] != key:
        problem = "stale (written for other inputs)"
    elif fields[3] != str(len(payload)) or fields[2] != hashlib.sha256(payload).hexdigest():
        problem = "corrupt (checksum or length mismatch)"
    else:
        try:
            return torch.load(io.BytesIO(payload), weights_only=True)
        except Exception as err:  # noqa: BLE001 (an unpickling or the object's own load-time check)
            problem = f"unloadable ({type(err).__name__}: {err})"
    warnings.warn(f"fgplugin cache entry {path} is {problem}; rebuilding it", CacheWarning, stacklevel=3)
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a read-only folder: the rebuilt entry cannot replace it either (cached() warns)
        pass
    return None


def cached(path: Path, key: str, build: Callable[[], Any]) -> Any:
    """Load the entry at ``path`` if it is valid for ``key``; otherwise build, save and return it.
    A folder that cannot be read or written costs the cache, not the result: a warning says why
    and the object is built (and returned) all the same."""
    try:
        obj = load_entry(path, key)
    except OSError as err:  # unreadable: permissions, a file where the folder should be, ...
        warnings.warn(f"fgplugin cache entry {path} cannot be read ({err}); building without it", CacheWarning,
                      stacklevel=2)
        return build()
    if obj is None:
        obj = build()
        try:
            save_entry(path, key, obj)
        except OSError as err:
            warnings.warn(f"fgplugin could not write its cache entry {path} ({err}); the result is used without "
                          "being cached. Point FGPLUGIN_CACHE_DIR (or cache=) at a writable folder to keep it",
                          CacheWarning, stacklevel=2)
    return obj
