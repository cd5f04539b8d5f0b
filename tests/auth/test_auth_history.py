"""The shared history in team mode: audit log, stars, saved comparisons, notes rendered safely,
hostile names/tags/notes stored literally, and downloads that cannot leave the run's folder."""

from __future__ import annotations

import re

import pytest

from backend.core.security import render_notes
from tests.auth.conftest import PASSWORD

HOSTILE = ["<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "$(rm -rf /)",
           "`id`; echo pwned | sh && x || y > /tmp/f", "'; DROP TABLE runs; --",
           "{{7*7}} ${7*7} <%= 7*7 %>", "../../etc/passwd", "a\u202eb"]


def test_hostile_names_tags_and_notes_are_stored_and_returned_literally(team, users):
    alice = users.create("alice")
    for text in HOSTILE:
        tag = text[:64]
        r = team.post("/api/runs", json={"preset": "ddp", "name": text, "tags": [tag],
                                         "notes": text}, headers=alice)
        assert r.status_code == 201, r.text
        got = team.get(f"/api/runs/{r.json()['id']}", headers=alice).json()
        assert (got["name"], got["tags"], got["notes"]) == (text, [tag], text)
        listed = team.get("/api/runs", params={"tag": tag}, headers=alice).json()["items"]
        assert [x["name"] for x in listed] == [text]
        patched = team.patch(f"/api/runs/{got['id']}", headers=alice,
                             json={"name": text + "!", "notes": "**" + text})
        assert patched.json()["name"] == text + "!" and patched.json()["notes"] == "**" + text
    assert team.get("/api/runs", params={"q": "<script>"}, headers=alice).json()["items"]


NOTES_CASES = [
    ("<script>alert(1)</script>", ["&lt;script&gt;alert(1)&lt;/script&gt;"], ["<script"]),
    ("<img src=x onerror=alert(1)>", ["&lt;img src=x onerror=alert(1)&gt;"], ["<img"]),
    ("[click](javascript:alert(1))", ["[click](javascript:alert(1))"], ["<a", "href"]),
    ("[x](https://e.org/?a=\"><script>)", [], ["<script", '"><']),
    ("[ok](https://example.org/a?b=1&c=2)",
     ['<a href="https://example.org/a?b=1&amp;c=2" rel="nofollow noopener noreferrer">ok</a>'],
     []),
    ("**bold** and *em* and `<b>code</b>`",
     ["<strong>bold</strong>", "<em>em</em>", "<code>&lt;b&gt;code&lt;/b&gt;</code>"], ["<b>"]),
    # CommonMark keeps a code block's last newline inside <code>.
    ("```\n<script>x</script>\n```", ["<pre><code>&lt;script&gt;x&lt;/script&gt;\n</code></pre>"],
     ["<script"]),
    ("[a](data:text/html,<script>)", [], ["<a", "<script"]),
    ("*<svg onload=alert(1)>*", ["<em>&lt;svg onload=alert(1)&gt;</em>"], ["<svg"]),
    ("[`x`](https://a.b) [y](http://c.d \"t\")", ['<a href="https://a.b"'], ["javascript"]),
    ("[x](JaVaScRiPt:alert(1)) [y](https://ok.org\" onmouseover=\"alert(1))",
     [], ["<a href=\"javascript", "onmouseover=\""]),
]


NOTES_CASES += [
    ("[m](mailto:a@b.c) [r](/runs/x) [v](vbscript:x)", ["[m](mailto:a@b.c)", "[r](/runs/x)"],
     ["<a", "href"]),
    ("![pixel](https://tracker.example/p.png)", [], ["<img", "src="]),
    ("<a href=\"https://x.org\" onclick=\"alert(1)\">x</a>", ["&lt;a href="],
     ["<a ", "onclick=\""]),
    ("line one\nline two", ["line one<br>", "line two"], []),
    ("<!-- c --><style>p{}</style><iframe src=x>", [], ["<!--", "<style", "<iframe"]),
]


@pytest.mark.parametrize("notes,must,must_not", NOTES_CASES)
def test_render_notes_is_an_escaped_markdown_subset(notes, must, must_not):
    html = render_notes(notes)
    for s in must:
        assert s in html, (s, html)
    for s in must_not:
        assert s not in html, (s, html)
    assert "<" not in re.sub(r"</?(p|br|em|strong|code|pre|a)( [^<>]*)?>", "", html), html


def test_notes_html_route(team, users):
    alice = users.create("alice")
    notes = "\n\n".join(n for n, _, _ in NOTES_CASES)
    rid = team.post("/api/runs", json={"preset": "ddp", "notes": notes},
                    headers=alice).json()["id"]
    r = team.get(f"/api/runs/{rid}/notes.html", headers=alice)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.text == render_notes(notes) and "<script" not in r.text
    assert team.get(f"/api/runs/{rid}", headers=alice).json()["notes"] == notes


EVIL_PATHS = ["../secret.txt", "..%2Fsecret.txt", "%2e%2e/secret.txt", "%2e%2e%2fsecret.txt",
              "%252e%252e%252fsecret.txt", "sub/../../secret.txt", "sub%2F..%2F..%2Fsecret.txt",
              "..%5Csecret.txt", "..\\secret.txt", "%2Fetc%2Fpasswd", "//etc/passwd",
              "%c0%ae%c0%ae/secret.txt", "....//secret.txt", "a.txt%00.png", "%2e%2e"]


def test_downloads_never_leave_the_run_folder(team, users, team_settings):
    alice = users.create("alice")
    rid = team.post("/api/runs", json={"preset": "ddp"}, headers=alice).json()["id"]
    run_dir = team_settings.runs_dir / rid
    (run_dir / "sub").mkdir(parents=True)
    (run_dir / "a.txt").write_text("inside")
    (team_settings.runs_dir / "secret.txt").write_text("TOP-SECRET")
    assert team.get(f"/api/runs/{rid}/files/a.txt", headers=alice).text == "inside"
    for evil in EVIL_PATHS:
        r = team.get(f"/api/runs/{rid}/files/{evil}", headers=alice)
        assert r.status_code in (400, 404), (evil, r.status_code)
        assert "TOP-SECRET" not in r.text and "root:" not in r.text, evil
    # Analysis tables and traces go through the same run-folder rule.
    for evil in ("..%2F..%2Fsecret", "%2e%2e"):
        r = team.get(f"/api/runs/{rid}/tables/{evil}.csv", headers=alice)
        assert "TOP-SECRET" not in r.text


def test_audit_log_records_who_did_what(team, users):
    admin, alice = users.create("root", "admin"), users.create("alice")
    rid = team.post("/api/runs", json={"preset": "ddp", "name": "r1"}, headers=alice).json()["id"]
    team.patch(f"/api/runs/{rid}", json={"tags": ["t"]}, headers=alice)
    team.post(f"/api/runs/{rid}/cancel", headers=admin)
    team.delete(f"/api/runs/{rid}", headers=alice)
    assert team.post("/api/users", json={"username": "carol", "password": PASSWORD,
                                         "role": "viewer"}, headers=admin).status_code == 201
    team.patch("/api/users/carol", json={"role": "member"}, headers=admin)
    tid = team.post("/api/auth/tokens", json={"name": "ci"}, headers=alice).json()["id"]
    team.delete(f"/api/auth/tokens/{tid}", headers=alice)
    team.post("/api/auth/login", json={"username": "ghost", "password": "whatever1"})
    entries = team.get("/api/audit", headers=admin, params={"limit": 100}).json()
    got = [(e["actor"], e["action"], e["target"]) for e in reversed(entries)]
    want = [("alice", "run.submit", rid), ("alice", "run.edit", rid),
            ("root", "run.cancel", rid), ("alice", "run.delete", rid),
            ("root", "user.create", "carol"), ("root", "user.role_change", "carol"),
            ("alice", "token.create", f"token {tid}"), ("alice", "token.revoke", f"token {tid}"),
            ("anonymous", "auth.login_failed", None)]
    assert [g for g in got if g[1] != "user.create" or g[2] == "carol"] == want
    failed = entries[0]
    assert failed["detail"] == {"username": "ghost"}  # what was typed, not whether it exists
    only = team.get("/api/audit", headers=admin, params={"action": "run.cancel"}).json()
    assert [e["action"] for e in only] == ["run.cancel"]
    assert only[0]["detail"]["owner"] == "alice"


def test_stars_and_saved_comparisons(team, users):
    alice, bob = users.create("alice"), users.create("bob")
    ids = [team.post("/api/runs", json={"preset": "ddp", "name": f"r{i}"},
                     headers=alice).json()["id"] for i in range(3)]
    assert team.put(f"/api/runs/{ids[0]}/star", headers=bob).json()["starred"] is True
    assert team.put(f"/api/runs/{ids[0]}/star", headers=bob).status_code == 200  # idempotent
    assert team.get(f"/api/runs/{ids[0]}", headers=bob).json()["starred"] is True
    assert team.get(f"/api/runs/{ids[0]}", headers=alice).json()["starred"] is False
    assert team.get("/api/stars", headers=bob).json() == [ids[0]]
    items = {r["id"]: r["starred"] for r in team.get("/api/runs", headers=bob).json()["items"]}
    assert items == {ids[0]: True, ids[1]: False, ids[2]: False}
    assert team.delete(f"/api/runs/{ids[0]}/star", headers=bob).json()["starred"] is False
    assert team.get("/api/stars", headers=bob).json() == []

    r = team.post("/api/comparisons", json={"name": "<b>dp vs ddp</b>", "run_ids": ids[:2]},
                  headers=bob)
    assert r.status_code == 201, r.text
    c = r.json()
    assert c["url"] == f"/compare?ids={ids[0]},{ids[1]}&saved={c['id']}"
    got = team.get(f"/api/comparisons/{c['id']}", headers=alice).json()
    assert got["name"] == "<b>dp vs ddp</b>" and got["owner"] == "bob"
    assert team.post("/api/comparisons", json={"name": "x", "run_ids": ids[:1]},
                     headers=bob).status_code == 422
    # well-formed, but it names a run that does not exist: 404 naming it
    r = team.post("/api/comparisons", json={"name": "x", "run_ids": [ids[0], "nope"]},
                  headers=bob)
    assert r.status_code == 404 and "nope" in r.json()["detail"], r.text
    assert team.delete(f"/api/comparisons/{c['id']}", headers=alice).status_code == 403
    assert team.delete(f"/api/comparisons/{c['id']}", headers=bob).status_code == 204
    assert team.get(f"/api/comparisons/{c['id']}", headers=bob).status_code == 404


def test_viewers_write_nothing_no_star_no_saved_comparison(team, users):
    """Policy (docs/security.md): a viewer only reads; stars and saved comparisons are writes."""
    alice, vera = users.create("alice"), users.create("vera", "viewer")
    ids = [team.post("/api/runs", json={"preset": "ddp"}, headers=alice).json()["id"]
           for _ in range(2)]
    r = team.put(f"/api/runs/{ids[0]}/star", headers=vera)
    assert r.status_code == 403
    assert r.json() == {"detail": "starring runs needs the member role (you are viewer)"}
    assert team.delete(f"/api/runs/{ids[0]}/star", headers=vera).status_code == 403
    assert team.get("/api/stars", headers=vera).json() == []
    r = team.post("/api/comparisons", json={"name": "mine", "run_ids": ids}, headers=vera)
    assert r.status_code == 403
    assert r.json() == {"detail": "saving comparisons needs the member role (you are viewer)"}
    assert team.get("/api/comparisons", headers=vera).json() == []
    # A viewer still reads what others saved.
    saved = team.post("/api/comparisons", json={"name": "a", "run_ids": ids}, headers=alice)
    assert saved.status_code == 201
    got = team.get(f"/api/comparisons/{saved.json()['id']}", headers=vera)
    assert got.status_code == 200 and got.json()["run_ids"] == ids
    assert team.get(f"/api/runs/{ids[0]}", headers=vera).json()["starred"] is False
