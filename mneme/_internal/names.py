"""The names that may travel: store object names, the keys requests give, record ids.

One rule for every object name of every store (:func:`validate_name`: relative,
'/'-separated, safe characters, no '..', empty or hidden components), which the
store backends apply on every call and the replay servers apply to the keys
clients send (:func:`validate_store_key`, the same rule with the request's words);
record ids are the decimal or hex hashes the recorder writes. Anything else is
refused before it reaches a store or a worker.
"""

from __future__ import annotations

import re

from mneme.errors import ArtifactError, ConfigurationError

#: Longest accepted object name (S3 keys are limited to 1024 bytes including the prefix).
MAX_NAME_LENGTH = 512
#: Longest accepted path component (common file-system limit).
MAX_COMPONENT_LENGTH = 255
_COMPONENT_CHARS = re.compile(r"[A-Za-z0-9._+=@,~-]+")

_RECORD_ID = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")


class InvalidNameError(ArtifactError, ValueError):
    """An object name that is not acceptable to any store (both an ArtifactError and a ValueError)."""


def validate_name(name: str) -> str:
    """Return ``name`` unchanged if it is a safe object name, else raise :class:`InvalidNameError`.

    A name is relative and ``/``-separated; each component is non-empty, does not
    start with a dot (hidden files and ``.``/``..`` are reserved: temporary files
    of atomic writes are hidden), and uses only letters, digits and ``._+=@,~-``.

    Args:
        name: the object name.

    Returns:
        ``name`` unchanged.

    Raises:
        InvalidNameError: the name breaks one of these rules or is too long.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"an object name is a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError("an object name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"object name {name[:60]!r}... is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if "\\" in name:
        raise InvalidNameError(f"object name {name!r} contains a backslash; use '/' to separate components")
    if name.startswith("/"):
        raise InvalidNameError(f"object name {name!r} is absolute; names are relative to the store")
    for component in name.split("/"):
        if not component:
            raise InvalidNameError(f"object name {name!r} has an empty component ('//' or a trailing '/')")
        if component in (".", ".."):
            raise InvalidNameError(f"object name {name!r} contains {component!r}; names cannot leave the store")
        if component.startswith("."):
            raise InvalidNameError(f"object name {name!r} has a hidden component {component!r}")
        if len(component) > MAX_COMPONENT_LENGTH:
            raise InvalidNameError(
                f"object name {name!r} has a component longer than {MAX_COMPONENT_LENGTH} characters"
            )
        if not _COMPONENT_CHARS.fullmatch(component):
            raise InvalidNameError(
                f"object name {name!r} has characters outside letters, digits and '._+=@,~-'"
            )
    return name


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a name prefix (may end with '/', may stop mid-component).

    Args:
        prefix: the prefix.

    Returns:
        ``prefix`` unchanged.

    Raises:
        InvalidNameError: it is not the start of a valid name.
    """
    if prefix == "":
        return prefix
    stripped = prefix[:-1] if prefix.endswith("/") else prefix
    validate_name(stripped)
    return prefix


def validate_store_key(key: str) -> str:
    """A key a client gives for an object of the server's store (``record_db``): the store's rule.

    Args:
        key: the key, relative to the store.

    Returns:
        ``key`` unchanged.

    Raises:
        ConfigurationError: ``key`` names nothing inside a store (absolute, ``..``, hidden, odd characters).
    """
    if not key:
        raise ConfigurationError("record_db is empty; name the recording database by its store key, e.g. '1234.json'")
    try:
        return validate_name(key)
    except InvalidNameError as exc:
        raise ConfigurationError(f"record_db {key!r} is not a valid store key: {exc}") from None


def validate_record_id(record_id: str) -> str:
    if not _RECORD_ID.match(record_id or ""):
        raise ConfigurationError(
            f"record_id {record_id!r} is not a recorded instance id (the dynamic hash: letters and digits)"
        )
    return record_id
