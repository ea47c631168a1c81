"""Downloading one file by url, checked: resumed where a killed job stopped (HTTP range requests), progress
logged, the announced size and the md5/sha256 checked before the file appears under its name (rules/fetch.smk's
``download_<dataset>_<file>`` jobs; which files: :mod:`.fetch`)."""

from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from dpr_pipeline.errors import FetchError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: OSErrors of our own disk (full, over quota, read-only), not of the download: reported as such, not retried.
LOCAL_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}

def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{size:.1f} TB"


def file_hash(path: str | Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Truncated(Exception):
    def __init__(self, received: int, total: int):
        super().__init__(f"the connection closed after {received} of {total} bytes")
        self.received, self.total = received, total


def _fetch_into(url: str, part: Path, headers: dict, timeout: float, progress_every: float) -> None:
    """Download ``url`` into ``part``, continuing a partial ``part`` where the server accepts a range request."""
    have = part.stat().st_size if part.exists() else 0
    request_headers = {"User-Agent": "dpr_pipeline", **headers}
    if have:
        request_headers["Range"] = f"bytes={have}-"
    with urllib.request.urlopen(urllib.request.Request(url, headers=request_headers), timeout=timeout) as response:
        if have and response.status == 206:
            log.info("%s: resuming after %s already downloaded", part.name, _human(have))
            start, mode = have, "ab"
        else:
            if have:
                log.info("%s: the server does not resume downloads; starting again", part.name)
            start, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        received, began, last = start, time.monotonic(), time.monotonic()
        with open(part, mode) as out:
            while True:
                chunk = response.read(_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                received += len(chunk)
                now = time.monotonic()
                if now - last >= progress_every:
                    share = f" of {_human(total)} ({100 * received / total:.1f} %)" if total else ""
                    log.info("%s: %s%s, %s/s", part.name, _human(received), share,
                             _human((received - start) / max(now - began, 1e-9)))
                    last = now
        if total is not None and received < total:
            raise _Truncated(received, total)
        log.info("%s: %s downloaded in %.1f s", part.name, _human(received), time.monotonic() - began)


def download_file(url: str, dest: str | Path, *, md5: str | None = None, sha256: str | None = None,
                  headers: dict | None = None, tries: int = 3, timeout: float = 60.0, retry_wait: float = 5.0,
                  progress_every: float = 30.0) -> str:
    """Download ``url`` to ``dest`` and check it; return the file's SHA-256.

    The bytes go to ``<dest>.part`` first; only a complete file whose checksum (``sha256`` or ``md5``) matches
    is renamed to ``dest``. A ``.part`` left by a killed job is continued with an HTTP range request (or
    restarted where the server does not support ranges). A connection that drops is retried ``tries`` times,
    continuing where it stopped. A download that stays short of the announced size, fails, or does not match
    its checksum raises one :class:`FetchError` naming the file (expected and found sum or size) and removes
    ``.part``: nothing is left behind.
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    algorithm, expected = ("sha256", sha256) if sha256 else ("md5", md5) if md5 else (None, None)
    log.info("downloading %s -> %s (%s)", url, dest, f"{algorithm} {expected}" if expected else "no checksum")
    for attempt in range(1, tries + 1):
        truncated = None
        try:
            _fetch_into(url, part, dict(headers or {}), timeout, progress_every)
            break
        except urllib.error.HTTPError as err:
            if err.code == 416:                       # a .part at least as long as the file: start afresh
                part.unlink(missing_ok=True)
            elif 400 <= err.code < 500 and err.code not in (408, 429):
                part.unlink(missing_ok=True)
                raise FetchError(dest, f"the server answered {err.code} {err.reason} for {url}",
                                 "check the `url` of this file under the dataset's `downloads` in config.yaml") from None
            problem = f"HTTP {err.code} {err.reason}"
        except _Truncated as err:
            problem, truncated = str(err), err
        except (OSError, http.client.HTTPException) as err:
            problem = f"{type(err).__name__}: {err}"
        if attempt == tries:
            part.unlink(missing_ok=True)
            if truncated is not None:
                raise FetchError(dest, f"the download from {url} is truncated: expected {truncated.total} bytes, "
                                 f"found {truncated.received} (after {tries} attempts)",
                                 "rerun the fetch job; if it stays short, the server or the network cuts the "
                                 "transfer: download the file by hand into the dataset's path") from None
            raise FetchError(dest, f"the download from {url} failed after {tries} attempts ({problem})",
                             "check that this node reaches the server (compute nodes without internet: run the "
                             "fetch on the login node, docs/cluster.md), then rerun") from None
        log.warning("%s: attempt %d of %d failed (%s); trying again, continuing the partial file",
                    dest.name, attempt, tries, problem)
        time.sleep(retry_wait * attempt)
    found_sha256 = _checked_sha256(part, dest, url, algorithm, expected)
    os.replace(part, dest)
    log.info("%s: %s OK", dest, f"{algorithm} {expected.lower()}" if expected else f"sha256 {found_sha256}")
    return found_sha256


def _checked_sha256(part: Path, dest: Path, url: str, algorithm: str | None, expected: str | None) -> str:
    """The SHA-256 of the downloaded ``part``, after checking it against ``expected`` (``algorithm``'s sum; a
    mismatch removes ``part`` and is a FetchError); without a checksum, a warning that prints the sum to pin."""
    found_sha256 = file_hash(part, "sha256")
    if expected:
        found = found_sha256 if algorithm == "sha256" else file_hash(part, algorithm)
        if found != expected.lower():
            part.unlink(missing_ok=True)
            raise FetchError(dest, f"checksum mismatch: expected {algorithm} {expected.lower()}, found {found} "
                             f"(downloaded from {url}; the partial file was removed)",
                             "rerun the fetch job to download it again; if the same sum comes back, the file "
                             "changed at its source: check `url` and the checksum in config.yaml")
    else:
        log.warning("%s has no checksum in config.yaml; its sha256 is %s: add `sha256: %s` to pin it",
                    dest, found_sha256, found_sha256)
    return found_sha256
