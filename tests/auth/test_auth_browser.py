"""Team mode end to end: the real `paralab serve` with PARALAB_AUTH=required, users made with
`paralab users create`, a token from `paralab token create`, and the dashboard in Chromium
(log in, see others' runs, submit, log out). Runs go to a queue no worker serves."""

from __future__ import annotations

import secrets
import subprocess

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.browser import chromium_browser

PASSWORD = "team mode pass 1"
EVIL = "<img src=x onerror=alert(1)> $(id)"


class TeamService(Service):
    def cli(self, *args: str, stdin: str = "", **env) -> subprocess.CompletedProcess:
        return subprocess.run(self._argv(*args), env={**self.env, **env}, cwd=self.tmp,
                              input=stdin, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def team_svc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("team")
    svc = TeamService(tmp, db_url=f"sqlite:///{tmp}/p.db", redis_url=None, extra_env={
        "PARALAB_AUTH": "required", "PARALAB_SECRET_KEY": secrets.token_hex(32),
        "PARALAB_ARGON2_MEMORY_KIB": "1024", "PARALAB_ARGON2_TIME_COST": "1",
        "PARALAB_ARGON2_PARALLELISM": "1"})
    try:
        for args in (("alice", "--role", "member"), ("bob", "--role", "member")):
            r = svc.cli("users", "create", *args, "--password-stdin", stdin=PASSWORD + "\n")
            assert r.returncode == 0, r.stderr
        svc.start_backend()
        svc.idle = f"nobody-{secrets.token_hex(3)}"
        yield svc
    finally:
        svc.close()


@pytest.fixture(scope="module")
def bob_run(team_svc) -> str:
    """bob gets a token through the CLI and submits with it."""
    svc = team_svc
    r = svc.cli("token", "create", "--user", "bob", "--password-stdin", "--name", "ci",
                stdin=PASSWORD + "\n")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("plt_") and "shown once" in r.stderr
    listed = svc.cli("token", "list", PARALAB_TOKEN=token)
    assert listed.returncode == 0 and token[:12] in listed.stdout and token not in listed.stdout
    http = httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"})
    run = http.post("/api/runs", json={"preset": "ddp", "name": EVIL,
                                       "runtime": {"queue": svc.idle}})
    assert run.status_code == 201, run.text
    assert run.json()["owner"] == "bob"
    out = svc.cli("runs", PARALAB_TOKEN=token)
    assert out.returncode == 0 and run.json()["id"] in out.stdout
    return run.json()["id"]


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser()


@pytest.fixture
def alice_page(browser, team_svc):
    """A page logged in as alice through the login form."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    pg.goto(f"{team_svc.url}/")
    pg.wait_for_url("**/login?next=%2F")
    pg.fill("#username", "alice")
    pg.fill("#password", "wrong password")
    pg.click("#login-submit")
    expect(pg.locator("#login-error")).to_have_text("Invalid username or password.")
    pg.fill("#password", PASSWORD)
    pg.click("#login-submit")
    pg.wait_for_url(f"{team_svc.url}/")
    cookie = next(c for c in ctx.cookies() if c["name"] == "paralab_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    yield pg
    ctx.close()
    assert problems == []


def test_team_dashboard_login_submit_see_others_logout(team_svc, bob_run, alice_page):
    pg, svc = alice_page, team_svc
    bob_row = pg.locator(f"tr[data-run-id='{bob_run}']")
    expect(bob_row).to_contain_text("bob")
    expect(bob_row.locator(".run-name")).to_have_text(EVIL)  # shown literally
    # Submit from the form as alice.
    pg.goto(f"{svc.url}/new?preset=ddp")
    pg.fill("#name", "alice from the browser")
    pg.fill("#f-train-steps", "1")
    pg.fill("#f-runtime-queue", svc.idle)
    expect(pg.locator("#submit")).to_be_enabled()
    pg.click("#submit")
    pg.wait_for_url("**/runs/*")
    mine = pg.url.rstrip("/").split("/")[-1]
    pg.goto(f"{svc.url}/")
    own_row = pg.locator(f"tr[data-run-id='{mine}']")
    expect(own_row).to_contain_text("alice")
    expect(own_row.locator("button.cancel")).to_have_count(1)
    # The API agrees: alice may change her run, not bob's.
    runs = pg.evaluate("""async () => (await (await fetch('/api/runs')).json()).items
        .map(r => [r.id, r.owner, r.can_modify])""")
    assert [bob_run, "bob", False] in runs and [mine, "alice", True] in runs
    status = pg.evaluate(f"""async () => (await fetch('/api/runs/{bob_run}/cancel',
        {{method: 'POST'}})).status""")
    assert status == 403
    # Logging out ends the session: pages go back to the login form.
    assert pg.evaluate("async () => (await fetch('/api/auth/logout', {method: 'POST'}))"
                       ".status") == 204
    pg.goto(f"{svc.url}/runs/{mine}")
    pg.wait_for_url(f"**/login?next=%2Fruns%2F{mine}")


def test_no_cancel_button_on_others_runs(team_svc, bob_run, alice_page):
    pg = alice_page
    # alice's own queued run (idle queue: it stays queued) has one, so the check can fail.
    mine = pg.evaluate(f"""async () => (await (await fetch('/api/runs', {{method: 'POST',
        headers: {{'Content-Type': 'application/json'}}, body: JSON.stringify({{
        preset: 'ddp', name: 'alice own', runtime: {{queue: '{team_svc.idle}'}}}})
        }})).json()).id""")
    pg.goto(f"{team_svc.url}/")
    expect(pg.locator(f"tr[data-run-id='{mine}'] button.cancel")).to_have_count(1)
    expect(pg.locator(f"tr[data-run-id='{bob_run}']")).to_contain_text("bob")
    expect(pg.locator(f"tr[data-run-id='{bob_run}'] button.cancel")).to_have_count(
        0, timeout=5_000)
