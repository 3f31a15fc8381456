"""S3Store against a real moto server over HTTP: the Store contract, errors that say what to do."""

from __future__ import annotations

import json
import urllib.request

import pytest

from mneme.errors import ArtifactError, ConfigurationError
from mneme.store import InvalidNameError, open_store
from mneme.store.config import load_s3_settings
from mneme.store.s3 import (
    CredentialsError,
    S3Store,
    StoreUnavailableError,
    parse_s3_url,
)
from mneme.testing.moto_s3 import make_bucket, s3_environment, start_moto_server, stop


def test_put_get_list_delete_round_trip(s3_url):
    store = open_store(s3_url)
    assert isinstance(store, S3Store) and store.url == s3_url
    store.put("b/two", b"2" * 10)
    store.put("a.json", memoryview(b"{}"))
    store.put("b/one", bytearray(b"1"))
    assert store.get("b/two") == b"2" * 10
    assert store.exists("a.json") and not store.exists("nope")
    assert list(store.list()) == ["a.json", "b/one", "b/two"]
    assert list(store.list("b/")) == ["b/one", "b/two"]
    assert store.size("b/two") == 10
    assert store.local_path("a.json") is None
    store.delete("b/one")
    store.delete("b/one")  # deleting a missing object is not an error
    assert list(store.list("b")) == ["b/two"]


def test_prefix_isolates_stores_in_one_bucket(s3_url):
    bucket = parse_s3_url(s3_url)[0]
    first, second = open_store(f"s3://{bucket}/one"), open_store(f"s3://{bucket}/two")
    first.put("x", b"1")
    assert not second.exists("x") and list(second.list()) == []
    assert list(open_store(f"s3://{bucket}").list()) == ["one/x"]


def test_missing_object_is_a_clear_artifact_error(s3_url):
    store = open_store(s3_url)
    with pytest.raises(ArtifactError, match="missing.json not found in s3://"):
        store.get("missing.json")
    with pytest.raises(ArtifactError, match="not found"):
        store.size("missing.json")


def test_touch_refreshes_modification_time(s3_url):
    store = open_store(s3_url)
    store.put("chunk", b"data")
    before = store.stat("chunk")
    store.touch("chunk")
    after = store.stat("chunk")
    assert after.modified >= before.modified and store.get("chunk") == b"data"


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/../../b", ".hidden", "a//b", "a\\b"])
def test_path_traversal_is_rejected_before_any_request(s3_url, name):
    store = open_store(s3_url)
    for call in (store.get, store.exists, store.delete, lambda n: store.put(n, b"x")):
        with pytest.raises(InvalidNameError):
            call(name)


def test_bad_urls_and_missing_bucket(s3_env):
    with pytest.raises(ConfigurationError, match="s3://bucket"):
        S3Store("s3://")
    with pytest.raises(ArtifactError):
        S3Store("s3://bucket/../x")
    store = open_store("s3://no-such-bucket-here/p")
    with pytest.raises(ArtifactError, match="bucket 'no-such-bucket-here' does not exist"):
        store.put("x", b"1")
    with pytest.raises(ArtifactError, match="does not exist"):
        store.check_access()


def test_unreachable_endpoint_is_retryable_error(monkeypatch):
    from mneme.testing.moto_s3 import free_port

    monkeypatch.setenv("MNEME_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MNEME_S3_CONFIG", "/dev/null")
    store = open_store("s3://bucket/p")
    with pytest.raises(StoreUnavailableError, match="MNEME_S3_ENDPOINT"):
        store.get("x")


def test_settings_from_file_and_environment_precedence(tmp_path):
    config = tmp_path / "s3.yml"
    config.write_text("endpoint: http://files:9000\naccess_key_id: filekey\nsecret_access_key: filesecret\n")
    settings = load_s3_settings({"MNEME_S3_CONFIG": str(config)})
    assert (settings.host, settings.secure, settings.access_key_id) == ("files:9000", False, "filekey")
    env = {"MNEME_S3_CONFIG": str(config), "AWS_ACCESS_KEY_ID": "envkey", "MNEME_S3_ENDPOINT": "https://m:1",
           "AWS_ENDPOINT_URL": "http://ignored:2"}
    settings = load_s3_settings(env)
    assert (settings.host, settings.secure, settings.access_key_id, settings.secret_access_key) == (
        "m:1", True, "envkey", "filesecret")
    assert "AWS_ACCESS_KEY_ID" in settings.source
    default = load_s3_settings({"HOME": str(tmp_path)})
    assert default.host == "s3.amazonaws.com" and default.secure
    config.write_text("endpoint: http://x:1\npassword: nope\n")
    with pytest.raises(ConfigurationError, match="unknown keys password"):
        load_s3_settings({"MNEME_S3_CONFIG": str(config)})
    with pytest.raises(ConfigurationError, match="MNEME_S3_CONFIG"):
        load_s3_settings({"MNEME_S3_CONFIG": str(tmp_path / "absent.yml")})
    with pytest.raises(ConfigurationError, match="http"):
        load_s3_settings({"MNEME_S3_CONFIG": "/dev/null", "AWS_ENDPOINT_URL": "ftp://host"})


@pytest.fixture
def authenticating_moto(tmp_path):
    """A moto server that checks credentials: one IAM user with full access, then auth switched on."""
    boto3 = pytest.importorskip("boto3")
    proc, endpoint = start_moto_server(tmp_path)
    try:
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="recorder")
        iam.put_user_policy(UserName="recorder", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="recorder")["AccessKey"]
        request = urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=5).read()
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        stop(proc)


def test_wrong_credentials_give_a_clear_error(authenticating_moto, monkeypatch):
    endpoint, access_key, secret_key = authenticating_moto
    for key, value in s3_environment(endpoint, access_key, secret_key).items():
        monkeypatch.setenv(key, value)
    make_bucket(endpoint, "auth-bucket", access_key, secret_key)
    good = open_store("s3://auth-bucket/p")
    good.put("x", b"1")
    assert good.get("x") == b"1"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(CredentialsError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") as info:
        open_store("s3://auth-bucket/p").get("x")
    assert "refused the credentials" in str(info.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
    with pytest.raises(CredentialsError, match="InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied"):
        open_store("s3://auth-bucket/p").put("y", b"2")
