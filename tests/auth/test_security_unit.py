"""The pure pieces of backend/core/security.py and backend/core/identity.py."""

from __future__ import annotations

import pytest

from backend.core import security
from backend.core.config import Settings
from backend.core.identity import safe_next


@pytest.mark.parametrize("target,want", [
    ("/", "/"), ("/runs/abc?tab=log", "/runs/abc?tab=log"),
    ("/compare?ids=a,b", "/compare?ids=a,b"),
    ("//evil.example/", "/"), ("/\\evil.example", "/"), ("https://evil.example/", "/"),
    ("javascript:alert(1)", "/"), ("", "/"), (None, "/"), ("/a\r\nSet-Cookie: x", "/"),
    ("/login?next=//evil", "/"), ("evil", "/"),
])
def test_safe_next(target, want):
    assert safe_next(target) == want


@pytest.mark.parametrize("headers,want", [
    ({"host": "h:8000", "origin": "http://h:8000"}, True),
    ({"host": "h:8000", "referer": "http://h:8000/runs/1"}, True),
    ({"host": "h", "origin": "https://h"}, True),  # TLS proxy in front: same host and port
    ({"host": "H:80", "origin": "http://h"}, True),
    ({"host": "h:8000", "origin": "http://h:8001"}, False),
    ({"host": "h:8000", "origin": "http://evil:8000"}, False),
    ({"host": "h:8000", "origin": "null"}, False),
    ({"host": "h:8000", "origin": "file://h:8000"}, False),
    ({"host": "h:8000", "referer": "http://evil/?http://h:8000"}, False),
    ({"host": "h:8000", "origin": "http://h:8000.evil"}, False),
    ({"host": "h:8000"}, None),
])
def test_origin_allowed(headers, want):
    assert security.origin_allowed(headers, "http") is want


def test_trusted_origins_for_a_rewriting_proxy():
    h = {"host": "backend:8000", "origin": "https://paralab.example.org"}
    assert security.origin_allowed(h, "http") is False
    assert security.origin_allowed(h, "http", ["https://paralab.example.org"]) is True


def test_login_throttle_window():
    now = [0.0]
    t = security.LoginThrottle(3, 60, clock=lambda: now[0])
    for _ in range(3):
        assert t.retry_after(["u"]) == 0
        t.failed(["u"])
    assert t.retry_after(["u"]) == pytest.approx(60)
    assert t.retry_after(["other"]) == 0
    now[0] = 59.0
    assert t.retry_after(["u"]) == pytest.approx(1)
    now[0] = 60.0
    assert t.retry_after(["u"]) == 0
    t.failed(["u"])
    t.succeeded(["u"])
    assert t.retry_after(["u"]) == 0


def test_passwords_are_argon2id_and_verify():
    s = Settings(argon2_time_cost=1, argon2_memory_kib=1024, argon2_parallelism=1)
    h = security.hash_password(s, "a long password")
    assert h.startswith("$argon2id$") and "a long password" not in h
    assert security.verify_password(s, h, "a long password")
    assert not security.verify_password(s, h, "a long passworD")
    assert not security.verify_password(s, None, "a long password")
    assert not security.verify_password(s, "!", "anything")
    assert security.check_password_policy(s, "short") == \
        f"password: at least {s.password_min_length} characters"
    assert security.check_password_policy(s, "long enough!") is None


def test_usernames_and_cookies():
    assert security.check_username("alice.b-c_1") is None
    rule = ("username: 1-64 characters, lower-case letters, digits, '_', '-', '.', "
            "starting with a letter or digit")
    for bad in ("Alice", "a b", "", "-x", "x" * 65, "a/b", "<s>"):
        assert security.check_username(bad) == rule, bad
    assert security.check_username("local") == "username: 'local' is reserved"
    signed = security.sign_cookie("k" * 32, "pls_abc")
    assert security.unsign_cookie("k" * 32, signed) == "pls_abc"
    assert security.unsign_cookie("j" * 32, signed) is None
    assert security.unsign_cookie("k" * 32, "pls_abc.deadbeef") is None
    tok = security.new_token()
    assert tok.startswith("plt_") and len(tok) > 40
    assert security.token_hash(tok) != tok and len(security.token_hash(tok)) == 64


def test_bind_check():
    local, team = Settings(), Settings(auth="required", secret_key="x")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        security.check_bind(local, host)
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.org"):
        with pytest.raises(security.ConfigError):
            security.check_bind(local, host)
        security.check_bind(team, host)
