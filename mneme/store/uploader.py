"""The record agent's uploader: pushes a staging directory to a store while the recording goes on."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Sequence

from mneme.errors import ArtifactError, MnemeError
from mneme.format.layout import CHUNKS_DIR
from mneme.store import Store, open_store
from mneme.store.base import StoreUnavailableError
from mneme.store.contents import as_store, read_recording
from mneme.store.retry import RetryPolicy
from mneme.store.transfer import DEFAULT_WORKERS, TransferReport, transfer


def spool_bytes(directory: str | os.PathLike[str]) -> int:
    """Bytes of the chunks in a staging directory waiting for upload (what the spool limit bounds).

    Databases, snapshot manifests and code files are not counted: they are
    small, stay in the staging directory, and the uploader cannot free them.
    """
    total = 0
    for root, _, files in os.walk(Path(directory) / CHUNKS_DIR):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


class Uploader:
    """Uploads a local staging directory to a store while the producer keeps recording into it.

    For ``mneme record -rdb s3://...``: the agent commits recordings into
    ``staging_dir`` (a LocalStore, with :class:`mneme.format.writer.RecordingWriter`),
    calls :meth:`notify` after each commit, :meth:`wait_for_space` before
    writing a new instance, and :meth:`close` at the end. A background thread
    pushes whatever is committed (incrementally: a recording whose database is
    unchanged since the last pass costs no request), then deletes the
    uploaded chunks from the staging directory, which is what keeps the spool
    (the chunk bytes waiting for upload) within ``spool_limit`` bytes. Databases, snapshot and code files stay
    (they are small); a chunk deleted locally and needed again is simply
    written again by the producer, or found at the destination.

    Network trouble never loses data: a failed pass is retried with backoff for
    as long as the uploader runs; meanwhile the producer waits in
    :meth:`wait_for_space` once the spool is full (back-pressure instead of a
    full disk). If the agent dies, ``mneme push --resume STAGING URL`` finishes
    the upload later.
    """

    def __init__(
        self,
        staging_dir: str | os.PathLike[str],
        destination: Store | str,
        *,
        spool_limit: int | None = None,
        workers: int = DEFAULT_WORKERS,
        retry: RetryPolicy = RetryPolicy(attempts=4),
        retry_pass_max_s: float = 60.0,
        poll_interval_s: float = 2.0,
        prune: bool = True,
        progress: bool | None = False,
    ):
        self.staging_dir = Path(staging_dir)
        self.destination = as_store(destination)
        self.spool_limit = spool_limit
        self._source = open_store(self.staging_dir)
        self._workers, self._retry, self._prune, self._progress = workers, retry, prune, progress
        self._retry_pass_max_s, self._poll_interval_s = retry_pass_max_s, poll_interval_s
        self._cond = threading.Condition()
        self._wake = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.last_error: BaseException | None = None
        self.passes = 0
        self.total = TransferReport(self._source.url, self.destination.url)
        self._sent: dict[str, bytes] = {}

    # -- producer side --
    def start(self) -> "Uploader":
        self._thread = threading.Thread(target=self._run, name="mneme-uploader", daemon=True)
        self._thread.start()
        return self

    def notify(self) -> None:
        """A recording was committed in the staging directory: upload soon."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def spool_bytes(self) -> int:
        return spool_bytes(self.staging_dir)

    def wait_for_space(self, timeout: float | None = None) -> bool:
        """Block while the spool holds more than ``spool_limit`` bytes; False if ``timeout`` ran out first.

        Raises MnemeError if the uploader stopped on a permanent error (nothing would ever free space).
        """
        if self.spool_limit is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.spool_bytes() > self.spool_limit:
                self._raise_failure()
                self._wake = True
                self._cond.notify_all()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(timeout=min(remaining or 1.0, 1.0))
        return True

    def close(self, timeout: float | None = None) -> TransferReport:
        """Upload everything committed so far, stop the thread, and return the totals.

        Raises the last error if the final pass could not complete (the staging
        directory is intact: ``mneme push --resume`` it later).
        """
        with self._cond:
            self._closing = True
            self._wake = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise MnemeError(
                    f"upload of {self.staging_dir} to {self.destination.url} did not finish within {timeout} s; "
                    f"finish it with `mneme push --resume {self.staging_dir} {self.destination.url}`"
                )
        self._raise_failure()
        return self.total

    def __enter__(self) -> "Uploader":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            with self._cond:
                self._closing = True
                self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise MnemeError(
                f"uploading {self.staging_dir} to {self.destination.url} failed: {self._failure}; the staging "
                f"directory is intact: `mneme push --resume {self.staging_dir} {self.destination.url}`"
            ) from self._failure

    # -- uploader thread --
    def _run(self) -> None:
        backoff = self._retry.initial_delay_s
        while True:
            with self._cond:
                if not self._wake and not self._closing:
                    self._cond.wait(timeout=self._poll_interval_s)
                closing, self._wake = self._closing, False
            try:
                self._one_pass()
                backoff = self._retry.initial_delay_s
                self.last_error = None
            except StoreUnavailableError as exc:  # the network or the server is down: try again later
                self.last_error = exc
                if closing:
                    self._failure = exc
                    return
                with self._cond:  # sleep, but wake at once for close()
                    self._cond.wait_for(lambda: self._closing, timeout=backoff)
                backoff = min(backoff * 2, self._retry_pass_max_s)
                continue
            except BaseException as exc:  # a real error (corrupt staging, refused credentials): stop
                self._failure = self.last_error = exc
                with self._cond:
                    self._cond.notify_all()
                return
            with self._cond:
                self._cond.notify_all()
            if closing:
                return

    def _one_pass(self) -> None:
        if not self.staging_dir.is_dir():
            return  # the producer has not created it yet
        report = transfer(self._source, self.destination, resume=True, workers=self._workers,
                          retry=self._retry, progress=self._progress, sent=self._sent)
        self.passes += 1
        for key in ("chunks_copied", "chunks_present", "objects_copied", "objects_present", "bytes_copied"):
            setattr(self.total, key, getattr(self.total, key) + getattr(report, key))
        self.total.committed += [n for n in report.committed if n not in self.total.committed]
        if self._prune:
            self._prune_uploaded(report.committed)

    def _prune_uploaded(self, databases: Sequence[str]) -> None:
        """Delete from staging the chunks of recordings whose database the destination now holds."""
        for name in databases:
            try:
                contents = read_recording(self._source, name, self._retry)
            except ArtifactError:
                continue  # being rewritten by the producer right now; next pass
            if contents.raw != self._sent.get(name):
                continue  # the producer committed more since this pass read it: upload first
            for chunk in contents.chunk_names:
                self._source.delete(chunk)
