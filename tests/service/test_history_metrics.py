"""The history by its key figures (issue 13), in-process against SQLite and PostgreSQL: a
finished run's headline lands in sortable columns; sorting pages through every run exactly
once with the runs lacking the figure last (both directions); min_/max_ filters; bad numbers
are a 422 naming the parameter; migration 0005 backfills the columns from stored headlines."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from backend import crud
from backend.api.schemas import RunOut
from backend.core.db import get_sessionmaker
from backend.models import METRIC_COLUMNS

STEP_TIMES = [0.030, 0.010, None, 0.020, 0.010, None, 0.050]  # None: never analysed
PEAKS = [3e6, 1e6, None, 2e6, 5e6, None, 4e6]



@pytest.fixture
def runs(client, settings) -> list[str]:
    ids = [client.post("/api/runs", json={"preset": "ddp", "name": f"m{i}"}).json()["id"]
           for i in range(len(STEP_TIMES))]
    with get_sessionmaker(settings.db_url)() as db:
        for i, rid in enumerate(ids):
            crud.claim(db, rid, worker="w", task_id=None)
            head = None if STEP_TIMES[i] is None else {
                "step_time_s": STEP_TIMES[i], "peak_memory_bytes": PEAKS[i],
                "tokens_per_s": 1.0 / STEP_TIMES[i], "final_loss": 2.0 - i / 10}
            crud.finish(db, rid, status="succeeded", exit_code=0, error=None,
                        summary={"headline": head} if head else None, provenance={})
    return ids


def pages(client, **params) -> list[str]:
    out, cursor = [], None
    while True:
        page = client.get("/api/runs", params={**params, "limit": 2,
                                               **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        out += [r["id"] for r in body["items"]]
        if not (cursor := body["next_cursor"]):
            return out


def test_sort_by_a_figure_pages_every_run_once_nulls_last(client, runs):
    asc = pages(client, sort="step_time_s")
    desc = pages(client, sort="-step_time_s")
    assert sorted(asc) == sorted(runs) and sorted(desc) == sorted(runs)
    with_fig = [i for i, t in enumerate(STEP_TIMES) if t is not None]
    # ties (0.010 twice) broken by id, in the sort's direction
    want_asc = sorted(with_fig, key=lambda i: (STEP_TIMES[i], runs[i]))
    want_desc = sorted(with_fig, key=lambda i: (STEP_TIMES[i], runs[i]), reverse=True)
    nulls = [i for i, t in enumerate(STEP_TIMES) if t is None]
    assert asc == [runs[i] for i in want_asc] + sorted(runs[i] for i in nulls)
    assert desc == [runs[i] for i in want_desc] + sorted((runs[i] for i in nulls), reverse=True)
    first = client.get("/api/runs", params={"sort": "step_time_s", "limit": 1}).json()
    r = first["items"][0]
    assert r["step_time_s"] == 0.010 and r["tokens_per_s"] == 100.0
    assert r["duration_s"] >= 0 and r["final_loss"] in (1.9, 1.6)


def test_filters_by_peak_memory_and_refuses_bad_numbers(client, runs):
    got = pages(client, max_peak_memory_bytes=3e6, sort="peak_memory_bytes")
    assert got == [runs[1], runs[3], runs[0]]
    got = pages(client, min_peak_memory_bytes=2e6, max_peak_memory_bytes=4e6,
                sort="-peak_memory_bytes")
    assert got == [runs[6], runs[0], runs[3]]
    bad = client.get("/api/runs", params={"max_peak_memory_bytes": "2GB"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["query", "max_peak_memory_bytes"]


def test_the_api_exposes_every_figure_column():
    assert set(METRIC_COLUMNS) <= set(RunOut.model_fields)


def test_migration_0005_backfills_from_the_stored_headline(tmp_path):
    from alembic import command

    from backend.migrate import alembic_config, upgrade
    url = f"sqlite:///{tmp_path / 'old.db'}"
    cfg = alembic_config(url)
    command.upgrade(cfg, "0004")
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.text(
            "INSERT INTO runs (id, name, owner, kind, strategy, spec, spec_version, world_size, "
            "dp, tp, pp, queue, status, created_at, started_at, finished_at, cancel_requested, "
            "metrics, notes) VALUES ('r1', 'old', 'local', 'train', 'ddp', '{}', 1, 2, 2, 1, 1, "
            "'default', 'succeeded', '2026-01-01 00:00:00', '2026-01-01 00:00:00', "
            "'2026-01-01 00:00:07', 0, "
            "'{\"step_time_s\": 0.25, \"peak_memory_bytes\": 1234}', '')"))
    upgrade(url)
    with eng.begin() as c:
        row = c.execute(sa.text("SELECT step_time_s, peak_memory_bytes, duration_s, final_loss "
                                "FROM runs WHERE id = 'r1'")).one()
    assert tuple(row) == (0.25, 1234, 7.0, None)
    command.downgrade(cfg, "0004")
    with eng.begin() as c:
        cols = {r[1] for r in c.execute(sa.text("PRAGMA table_info(runs)"))}
    assert not cols & set(METRIC_COLUMNS)
    eng.dispose()


def test_the_models_are_what_the_migrations_build(db_url):
    """No drift between backend/models.py and the Alembic migrations, on both databases."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from backend.core.db import make_engine
    from backend.models import Base
    engine = make_engine(db_url)
    with engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    engine.dispose()
    assert diff == []


def test_a_finished_run_is_never_seen_without_its_figures(client, settings):
    """Every state another reader can see (each commit of crud.finish, read from a session of
    its own): once the run is succeeded, its headline is in the sortable columns too. A sweep
    read its members between two commits and found a succeeded run with no step time."""
    rid = client.post("/api/runs", json={"preset": "ddp", "name": "seen"}).json()["id"]
    make = get_sessionmaker(settings.db_url)
    seen = []

    def look(_session):
        with make() as other:
            r = other.execute(sa.text("SELECT status, step_time_s, peak_memory_bytes, "
                                      "duration_s FROM runs WHERE id = :i"), {"i": rid}).one()
            seen.append(tuple(r))

    with make() as db:
        crud.claim(db, rid, worker="w", task_id=None)
        sa.event.listen(db, "after_commit", look)
        crud.finish(db, rid, status="succeeded", exit_code=0, error=None, provenance={},
                    summary={"headline": {"step_time_s": 0.25, "peak_memory_bytes": 7e6}})
        # a retried report of the same outcome changes nothing anyone sees
        crud.finish(db, rid, status="succeeded", exit_code=0, error=None, provenance={},
                    summary={"headline": {"step_time_s": 0.5, "peak_memory_bytes": 1}})
    assert seen, "no commit observed"
    for status, step, peak, duration in seen:
        assert status == "succeeded" and step == 0.25 and peak == 7_000_000, seen
        assert duration is not None and duration >= 0, seen
