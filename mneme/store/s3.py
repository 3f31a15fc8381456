"""The S3/MinIO backend of :class:`mneme.store.base.Store`, through the ``minio`` client.

``s3://bucket/prefix`` maps object ``name`` to key ``prefix/name`` in
``bucket``. S3 makes a PUT visible whole or not at all, which is the
atomicity the Store contract asks for. Errors are translated into mneme
errors that say what to check: credentials, the endpoint, the bucket.
Network failures become :class:`StoreUnavailableError`, the one error the
transfer layer retries (with backoff).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import REPLACE, CopySource
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.helpers import MAX_PART_SIZE, MIN_PART_SIZE, check_bucket_name

from mneme.errors import ArtifactError, ConfigurationError, MnemeError
from mneme.store.base import ObjectInfo, Store, StoreUnavailableError, validate_name, validate_prefix
from mneme.store.config import CREDENTIALS_HINT, S3Settings, load_s3_settings

#: S3 error codes that mean "these credentials are not accepted here".
CREDENTIAL_ERROR_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "InvalidSecurity",
        "AuthorizationHeaderMalformed",
        "MissingSecurityHeader",
    }
)
#: Connect quickly to a dead endpoint; allow slow bodies of big objects.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0


#: One PUT takes at most 5 GiB (S3's limit); every object mneme writes is smaller.
MAX_SINGLE_PUT = MAX_PART_SIZE
#: S3 error codes that mean "the body the server received is not the one the request described".
CHECKSUM_ERROR_CODES = frozenset(
    {"BadDigest", "XAmzContentSHA256Mismatch", "XAmzContentChecksumMismatch"}
)


class CredentialsError(MnemeError):
    """The server refused the credentials."""


class TransferDamagedError(StoreUnavailableError):
    """The server received other bytes than were sent (its checksum of the body differs): sent again."""


def checksum_headers(sha256: bytes) -> dict[str, str]:
    """The request headers that make an S3 server verify a PUT's body: its SHA-256, base64.

    ``x-amz-checksum-sha256`` is the flexible checksum of the S3 API: AWS S3
    and MinIO compute the SHA-256 of the body they received and refuse the
    PUT (``BadDigest``/``XAmzContentChecksumMismatch``) when it differs, and
    keep it with the object (``HEAD`` with ``x-amz-checksum-mode: ENABLED``
    returns it). ``x-amz-sdk-checksum-algorithm`` names the algorithm, as the
    AWS SDKs send it. Over plain HTTP the minio client also signs the body's
    SHA-256 (``x-amz-content-sha256``); over HTTPS it sends ``Content-MD5``.

    Args:
        sha256: the digest (32 bytes) of the body.

    Returns:
        Header name -> value, for ``put_object(metadata=...)`` (``x-amz-`` headers pass through unchanged).
    """
    return {
        "x-amz-sdk-checksum-algorithm": "SHA256",
        "x-amz-checksum-sha256": base64.b64encode(sha256).decode("ascii"),
    }


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix``); the prefix may be empty."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigurationError(f"{url!r} is not an S3 URL; write s3://bucket or s3://bucket/prefix")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"S3 URL {url!r} has a query or fragment; write s3://bucket/prefix")
    try:
        check_bucket_name(parts.netloc)
    except ValueError as exc:
        raise ConfigurationError(f"{url!r} does not name a valid S3 bucket ({exc}); write s3://bucket/prefix") from None
    prefix = parts.path.strip("/")
    if prefix:
        validate_name(prefix)
    return parts.netloc, prefix


def _http_client() -> urllib3.PoolManager:
    """A connection pool sized for parallel transfers; retries only quick, idempotent transport hiccups."""
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        maxsize=32,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(total=2, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
    )


class S3Store(Store):
    """Objects in an S3 bucket under a key prefix.

    ``settings`` default to :func:`mneme.store.config.load_s3_settings`
    (environment, then ``~/.config/mneme/s3.yml``).

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``.
        settings: endpoint and credentials (None: ``load_s3_settings()``).
    """

    def __init__(self, url: str, settings: S3Settings | None = None) -> None:
        self._bucket, self._prefix = parse_s3_url(url)
        self._settings = settings or load_s3_settings()
        self._client = Minio(
            self._settings.host,
            access_key=self._settings.access_key_id,
            secret_key=self._settings.secret_access_key,
            session_token=self._settings.session_token,
            secure=self._settings.secure,
            region=self._settings.region,
            http_client=_http_client(),
        )

    # -- naming -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``s3://bucket/prefix`` (without a prefix: ``s3://bucket``)."""
        return f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"

    @property
    def bucket(self) -> str:
        """The bucket's name."""
        return self._bucket

    def _key(self, name: str) -> str:
        validate_name(name)
        return f"{self._prefix}/{name}" if self._prefix else name

    def _name(self, key: str) -> str:
        return key[len(self._prefix) + 1 :] if self._prefix else key

    # -- errors -------------------------------------------------------------------------------

    def _translate(self, exc: Exception, name: str | None, action: str) -> MnemeError:
        """Turn a minio/urllib3 exception into a mneme error that says what to do."""
        where = f"{self._settings.endpoint} (settings from {self._settings.source})"
        if isinstance(exc, S3Error):
            if exc.code in ("NoSuchKey", "NoSuchObject") and name is not None:
                return self.not_found(name)
            if exc.code == "NoSuchBucket":
                return self._missing_bucket()
            if exc.code in CHECKSUM_ERROR_CODES:
                return TransferDamagedError(
                    f"S3 at {where} received other bytes than were sent while trying to {action} ({exc.code}: "
                    f"{exc.message}); the object was not stored, and is sent again"
                )
            if exc.code in CREDENTIAL_ERROR_CODES:
                return CredentialsError(
                    f"S3 at {where} refused the credentials while trying to {action} ({exc.code}: "
                    f"{exc.message}); {CREDENTIALS_HINT}"
                )
            return MnemeError(f"S3 at {where} failed to {action}: {exc.code}: {exc.message}")
        if isinstance(exc, ServerError):
            return StoreUnavailableError(f"S3 at {where} failed to {action}: server error {exc}; retry later")
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, InvalidResponseError)):
            return StoreUnavailableError(
                f"cannot reach S3 at {where} to {action}: {exc}; check that the server runs and that "
                "MNEME_S3_ENDPOINT or AWS_ENDPOINT_URL points at it"
            )
        raise exc

    def _missing_bucket(self) -> ArtifactError:
        return ArtifactError(
            f"bucket {self._bucket!r} does not exist at {self._settings.endpoint}; create it (e.g. `mc mb` or "
            "the docker-compose stack's bucket job) or fix the s3:// URL"
        )

    def _call(self, action: str, name: str | None, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (S3Error, ServerError, InvalidResponseError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._translate(exc, name, action) from exc

    # -- Store interface ----------------------------------------------------------------------

    def get(self, name: str) -> bytes:
        key = self._key(name)

        def fetch() -> bytes:
            response = self._client.get_object(self._bucket, key)
            try:
                return response.read(decode_content=False)
            finally:
                response.close()
                response.release_conn()

        return self._call(f"read {name}", name, fetch)

    def put(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as ``name`` in one PUT that carries its SHA-256 (``x-amz-checksum-sha256``).

        The server computes the checksum of the body it received and refuses the
        object when they differ (AWS S3, MinIO), so bytes damaged on the way are
        never stored; :func:`checksum_headers` says more.

        Args:
            name: the object's name.
            data: the bytes.
        """
        key = self._key(name)
        view = memoryview(data).cast("B")
        self._put(name, key, io.BytesIO(view), view.nbytes, hashlib.sha256(view).digest())

    def put_file(self, name: str, path: str | Path) -> None:
        """Store a local file as ``name``: hashed first, then sent like :meth:`put` (with its checksum).

        Args:
            name: the object's name.
            path: the local file.
        """
        key = self._key(name)
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while piece := f.read(1 << 20):
                    digest.update(piece)
                size = f.tell()
                f.seek(0)
                self._put(name, key, f, size, digest.digest())
        except OSError as exc:  # the local file (network errors were translated by _put)
            raise ArtifactError(f"cannot store {name}: cannot read {path}: {exc.strerror or exc}") from exc

    def _put(self, name: str, key: str, stream, size: int, sha256: bytes) -> None:
        """One PUT of ``size`` bytes with their checksum (objects up to 5 GiB; larger ones go multipart)."""
        if size <= MAX_SINGLE_PUT:
            # One part of exactly the object's size: a single PutObject, which is what carries the checksum.
            self._call(f"write {name}", None, self._client.put_object, self._bucket, key, stream, size,
                       part_size=max(size, MIN_PART_SIZE), metadata=checksum_headers(sha256))
        else:  # mneme writes no object this large; multipart parts are each signed/MD5'd by the client
            self._call(f"write {name}", None, self._client.put_object, self._bucket, key, stream, size)

    def exists(self, name: str) -> bool:
        return self.stat(name) is not None

    def stat(self, name: str) -> ObjectInfo | None:
        """Size and last-modified time of ``name``, or None when it does not exist.

        Args:
            name: the object's name.

        Returns:
            An ``ObjectInfo``, or None.
        """
        key = self._key(name)
        try:
            result = self._client.stat_object(self._bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"):
                return None
            raise self._translate(exc, name, f"look up {name}") from exc
        except (ServerError, InvalidResponseError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._translate(exc, name, f"look up {name}") from exc
        return ObjectInfo(name, int(result.size or 0), _posix(result.last_modified))

    def list(self, prefix: str = "") -> Iterator[str]:
        for info in self.list_info(prefix):
            yield info.name

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Like :meth:`list`, with sizes and last-modified times (from the listing, no extra requests).

        Args:
            prefix: the names' start ('' for all).

        Yields:
            An ``ObjectInfo`` per object under the prefix.
        """
        validate_prefix(prefix)
        key_prefix = f"{self._prefix}/{prefix}" if self._prefix else prefix
        try:
            for obj in self._client.list_objects(self._bucket, prefix=key_prefix or None, recursive=True):
                name = self._name(obj.object_name)
                try:
                    validate_name(name)
                except ArtifactError:
                    continue  # foreign or hidden keys are not objects of this store
                yield ObjectInfo(name, int(obj.size or 0), _posix(obj.last_modified))
        except (S3Error, ServerError, InvalidResponseError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._translate(exc, None, f"list {prefix or 'the store'}") from exc

    def delete(self, name: str) -> None:
        key = self._key(name)
        self._call(f"delete {name}", None, self._client.remove_object, self._bucket, key)

    def size(self, name: str) -> int:
        info = self.stat(name)
        if info is None:
            raise self.not_found(name)
        return info.size

    def touch(self, name: str) -> None:
        """Refresh the last-modified time of ``name`` (a server-side self-copy; no data moves).

        Uploads touch the chunks they reuse so that a concurrent ``mneme gc``
        sees them as young and leaves them alone.

        Args:
            name: the object's name.
        """
        key = self._key(name)
        stamp = datetime.now(timezone.utc).isoformat()
        self._call(
            f"refresh {name}",
            name,
            self._client.copy_object,
            self._bucket,
            key,
            CopySource(self._bucket, key),
            metadata={"x-amz-meta-mneme-touched": stamp},
            metadata_directive=REPLACE,
        )

    def check_access(self) -> None:
        """Fail now, clearly, if the bucket is missing or the credentials are refused."""
        exists = self._call("open the bucket", None, self._client.bucket_exists, self._bucket)
        if not exists:
            raise self._missing_bucket()


def _posix(moment: datetime | None) -> float:
    return moment.timestamp() if moment is not None else 0.0
