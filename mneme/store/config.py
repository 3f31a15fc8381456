"""S3 connection settings: where they come from and how they are checked.

Settings are resolved in this order (first found wins, per field):

1. environment variables: ``MNEME_S3_ENDPOINT`` (overrides the endpoint),
   ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
   ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``);
2. the YAML file named by ``MNEME_S3_CONFIG``, else ``~/.config/mneme/s3.yml``
   (``$XDG_CONFIG_HOME/mneme/s3.yml`` when that is set), with the keys
   ``endpoint``, ``access_key_id``, ``secret_access_key``, ``session_token``,
   ``region``;
3. defaults: AWS's public endpoint ``https://s3.amazonaws.com``.

YAML rather than TOML because ``tomllib`` exists only from Python 3.11 and
mneme supports 3.10; pyyaml is already a dependency.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

import yaml

from mneme.errors import ConfigurationError

DEFAULT_ENDPOINT = "https://s3.amazonaws.com"
CONFIG_KEYS = ("endpoint", "access_key_id", "secret_access_key", "session_token", "region")
#: Which environment variable feeds which setting; the first one set wins.
ENV_VARIABLES: dict[str, tuple[str, ...]] = {
    "endpoint": ("MNEME_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL or MNEME_S3_ENDPOINT for "
    "MinIO or another S3-compatible server), or write access_key_id/secret_access_key/endpoint into "
    "~/.config/mneme/s3.yml (or the file MNEME_S3_CONFIG names)"
)


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible server: endpoint, credentials and region.

    ``source`` says where the settings came from, so that error messages can
    point the user at the right variable or file.
    """

    endpoint: str = DEFAULT_ENDPOINT
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    source: str = "defaults"

    @property
    def host(self) -> str:
        """``host[:port]`` as the minio client wants it."""
        return _split_endpoint(self.endpoint)[0]

    @property
    def secure(self) -> bool:
        """True for https endpoints."""
        return _split_endpoint(self.endpoint)[1]


def _split_endpoint(endpoint: str) -> tuple[str, bool]:
    """``http://host:port`` -> (``host:port``, False); a bare ``host:port`` means https."""
    if "://" not in endpoint:
        return endpoint.rstrip("/"), True
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"S3 endpoint {endpoint!r} is not an http(s) URL; set MNEME_S3_ENDPOINT or AWS_ENDPOINT_URL "
            "to something like http://127.0.0.1:9000"
        )
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"S3 endpoint {endpoint!r} has a path; give only scheme://host:port and put the bucket in the "
            "s3://bucket/prefix URL"
        )
    return parts.netloc, parts.scheme == "https"


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """The settings file read when ``MNEME_S3_CONFIG`` is not set."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".config")
    return Path(base) / "mneme" / "s3.yml"


def _read_config_file(path: Path, explicit: bool) -> dict[str, str]:
    if not path.exists():
        if explicit:
            raise ConfigurationError(f"MNEME_S3_CONFIG names {path}, which does not exist; fix the variable")
        return {}
    try:
        content = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read S3 settings from {path}: {exc}; fix or remove the file") from exc
    if not isinstance(content, dict):
        raise ConfigurationError(f"{path} must be a YAML mapping with keys {', '.join(CONFIG_KEYS)}")
    unknown = sorted(set(content) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{path} has unknown keys {', '.join(map(str, unknown))}; the known keys are {', '.join(CONFIG_KEYS)}"
        )
    return {key: str(value) for key, value in content.items() if value is not None}


def load_s3_settings(env: Mapping[str, str] | None = None) -> S3Settings:
    """Resolve the S3 settings from the environment and the settings file (see the module doc)."""
    env = os.environ if env is None else env
    explicit = "MNEME_S3_CONFIG" in env
    path = Path(env["MNEME_S3_CONFIG"]) if explicit else default_config_path(env)
    from_file = _read_config_file(path, explicit)
    values: dict[str, str] = {}
    sources: list[str] = []
    for key in CONFIG_KEYS:
        for variable in ENV_VARIABLES[key]:
            if env.get(variable):
                values[key] = env[variable]
                sources.append(variable)
                break
        else:
            if key in from_file:
                values[key] = from_file[key]
                sources.append(f"{key} in {path}")
    settings = S3Settings(**values, source=", ".join(sources) or "defaults")
    _split_endpoint(settings.endpoint)  # validate early, with a clear message
    return settings
