"""``data_dir: s3://…``: what the settings accept and refuse, and where each part lives.

No server here (``scale/test_object_storage.py`` runs every command against one): the URL
checks, the split between the bucket and this machine's ``local_dir``, and the AWS variables
read for the object store.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memory_pipeline import storage
from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import settings_from_dict

SOURCES = [{"name": "mem", "path": "mem"}]


def _settings(tmp_path: Path, **raw):
    return settings_from_dict({"sources": SOURCES, **raw}, base_dir=tmp_path)


def test_an_s3_data_dir_keeps_the_shared_part_in_the_bucket_and_the_rest_local(tmp_path: Path):
    s = _settings(tmp_path, data_dir="s3://team-memory/agents/", local_dir="here")
    data = storage.of(s)
    assert s.data_dir == "s3://team-memory/agents"  # normalised: no trailing slash
    assert data.remote == "s3://team-memory/agents" and data.location == "s3://team-memory/agents"
    assert data.lancedb_uri == "s3://team-memory/agents/lancedb"
    assert data.asset_location("memory_chunks") == "s3://team-memory/agents/assets/memory_chunks"
    assert data.where(storage.GENERATIONS) == "s3://team-memory/agents/generations.json"
    assert data.root == (tmp_path / "here").resolve()
    assert data.cache_path == data.root / "cache" / "embeddings.sqlite"
    assert data.analytics_db.parent == data.root and data.locks_dir.is_relative_to(data.root)


def test_a_local_data_dir_is_unchanged(tmp_path: Path):
    data = storage.of(_settings(tmp_path, data_dir="idx"))
    assert data.remote == "" and data.root == (tmp_path / "idx").resolve()
    assert data.lancedb_uri == str(data.root / "lancedb") and data.location == str(data.root)
    assert data.asset_location("source_files") == str(data.root / "assets" / "source_files")


def test_the_default_local_dir_follows_xdg_cache_home(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = storage.of(_settings(tmp_path, data_dir="s3://b/p/q"))
    assert data.root == tmp_path / "xdg" / "memory_pipeline" / "s3" / "b" / "p" / "q"


def test_the_object_store_reads_the_aws_variables_and_refuses_plain_http_unless_allowed(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(ConfigError, match="AWS_ALLOW_HTTP"):
        storage.object_store()
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    fs = storage.object_store()
    assert fs.type_name == "s3" and fs.region == "eu-west-1"


# The userinfo part of a URL: anything a user might paste, with the secret in it.
_secret = st.text(alphabet=st.characters(min_codepoint=48, max_codepoint=122, categories=("Lu", "Ll", "Nd")), min_size=6, max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    key=_secret,
    secret=_secret,
    bucket=st.from_regex(r"[a-z0-9][a-z0-9-]{2,20}", fullmatch=True),
    prefix=st.from_regex(r"(/[a-z0-9_-]{1,10}){0,3}", fullmatch=True),
)
@example(key="abcdefgh", secret="secret", bucket="bkt", prefix="")  # a word of the refusal itself (found by hypothesis)
def test_credentials_in_the_url_are_refused_and_never_echoed(tmp_path_factory, key: str, secret: str, bucket: str, prefix: str):
    base = tmp_path_factory.getbasetemp()

    def refusal(url: str) -> str:
        with pytest.raises(ConfigError) as err:
            _settings(base, data_dir=url)
        return str(err.value) + (getattr(err.value, "hint", "") or "")

    for form in ("s3://{key}:{secret}@{bucket}{prefix}", "s3://{secret}@{bucket}{prefix}"):
        text = refusal(form.format(key=key, secret=secret, bucket=bucket, prefix=prefix))
        # Refused by the secrets guard (any key: "looks like an API key or secret") or by the URL check.
        assert "data_dir" in text and ("credentials" in text or "secret" in text)
        # A "secret" that is a word of the refusal itself (hypothesis found "secret") is no echo:
        # what the refusal says of another secret there is the control.
        control = refusal(form.format(key=key, secret="Zq7" * 4, bucket=bucket, prefix=prefix))
        assert secret not in text or secret in control
    ok = _settings(base, data_dir=f"s3://{bucket}{prefix}")
    assert ok.data_dir == f"s3://{bucket}{prefix}".rstrip("/")


@pytest.mark.parametrize(
    "url, expect", [("s3://", "bucket"), ("s3:///x", "bucket"), ("s3://b/x?versionId=1", "query"), ("gs://b/x", "s3://"), ("file:///tmp/x", "s3://")]
)
def test_odd_urls_name_the_key_and_the_fix(tmp_path: Path, url: str, expect: str):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, data_dir=url)
    assert "data_dir" in str(err.value) and expect in str(err.value)


@pytest.mark.parametrize("url", ["s3://b//x", "s3://b/x/../y", "s3://b/./x", "s3://b/x?"])
def test_empty_dot_segments_and_stray_queries_are_refused(tmp_path: Path, url: str):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, data_dir=url)
    assert "data_dir" in str(err.value)


def test_a_url_from_an_environment_variable_is_object_storage(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MEMORY_BUCKET", "s3://team-memory")
    s = _settings(tmp_path, data_dir="${MEMORY_BUCKET}/agents", local_dir="here")
    assert s.data_dir == "s3://team-memory/agents" and storage.of(s).remote == "s3://team-memory/agents"


def test_local_dir_is_refused_beside_a_local_data_dir(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, data_dir="idx", local_dir="here")
    assert "local_dir" in str(err.value) and "s3://" in str(err.value)


def test_the_server_file_is_found_where_the_server_writes_it(tmp_path: Path, monkeypatch):
    """`memory search` finds a running server through the YAML alone (no settings loaded): the
    folder it derives must be the one the server uses, however the URL is spelled."""
    from memory_pipeline.service.client import config_and_data_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for url in ("S3://team-memory/agents/", "s3://team-memory/agents"):
        cfg = tmp_path / "memory_pipeline.yaml"
        cfg.write_text(f"data_dir: {url}\nsources: [{{name: mem, path: mem}}]\n")
        found = config_and_data_dir(str(cfg))
        assert found is not None
        assert found[1] == storage.of(_settings(tmp_path, data_dir=url)).root


@settings(max_examples=300, deadline=None)
@given(tail=st.text(max_size=60))
def test_any_s3_url_is_accepted_in_normal_form_or_refused_by_name(tmp_path_factory, tail: str):
    """Hostile text after ``s3://``: a ConfigError naming data_dir, or a URL that check_url leaves as
    it is (normal form) and whose local folder stays under the cache root; never another exception.
    (It found a NUL in the URL accepted, then failing as a path deep inside the run.)"""
    base = tmp_path_factory.getbasetemp()
    try:
        s = _settings(base, data_dir="s3://" + tail)
    except ConfigError as err:
        assert "data_dir" in str(err)
        return
    assert isinstance(s.data_dir, str) and storage.check_url(s.data_dir) == s.data_dir
    local = storage.default_local_dir(s.data_dir)  # a real folder name, never climbing out of the cache root
    assert ".." not in local.parts and local.resolve().exists() in (True, False)


@pytest.mark.parametrize("endpoint, shown", [
    ("http://admin:hunter2@127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("http://admin:p@ss@host:9", "http://host:9"),  # a hand-pasted password with "@", "/", "#" or "?" in it
    ("http://admin:pa/ss@host", "http://host"),
    ("http://a:b#c?d@h:1", "http://h:1"),
    ("u:p@host:9", "host:9"),
    ("https://minio.internal:9000", "https://minio.internal:9000"),
])  # fmt: skip
def test_an_endpoints_password_is_never_shown(endpoint: str, shown: str):
    assert storage.shown_endpoint(endpoint) == shown
    said = storage.one_line(f'Could not connect to the endpoint URL: "{endpoint}/memory"')
    assert said == f'Could not connect to the endpoint URL: "{shown}/memory"' or "://" not in endpoint, said
    assert not any(secret in said for secret in ("hunter2", "p@ss", "pa/ss", "b#c?d"))


# What a hand-pasted user name or password may hold: anything but whitespace and control
# characters (str.split would cut the message there); "@", "/", "#", "?", ":" and "://" included.
_PASTED = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https"]),
    user=_PASTED,
    password=_PASTED,
    host=st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?", fullmatch=True),
    port=st.one_of(st.none(), st.integers(1, 65535)),
)
@example(scheme="http", user="u", password="a://b", host="h", port=9)
@example(scheme="http", user="a@b", password="c@d/e#f?g", host="h", port=None)
def test_no_user_name_or_password_of_any_endpoint_is_shown(scheme: str, user: str, password: str, host: str, port: int | None):
    where = f"{host}:{port}" if port else host
    for endpoint in (f"{scheme}://{user}:{password}@{where}", f"{scheme}://{password}@{where}"):
        assert storage.shown_endpoint(endpoint) == f"{scheme}://{where}", endpoint
        said = storage.one_line(f'Could not connect to the endpoint URL: "{endpoint}/memory/assets"')
        assert said == f'Could not connect to the endpoint URL: "{scheme}://{where}/memory/assets"', (endpoint, said)
    bare = f"{user}:{password}@{where}"  # a bare host:port, unless it reads as a scheme ("ab" + ":" + "//…")
    if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", bare):
        assert storage.shown_endpoint(bare) == where
