"""The API's log ingest, side by side: a 2,000-step 2-rank run's 4,000 lines stored through
`crud.append_logs` (an INSERT ... ON CONFLICT DO NOTHING RETURNING seq on the table, a Core
executemany) against the same statement on the ORM entity (what it was: the ORM's bulk insert
fetched and matched every row's primary key). Batches as the worker ships them (a few lines
to a few hundred); arms alternated; CPU seconds of this process (the database is SQLite in a
file, in process, as the embedded default has it; --db-url for PostgreSQL: a scratch database,
whose tables it creates if missing).

    .venv/bin/python bench/log_ingest.py [--lines 4000] [--batch 20 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, delete  # noqa: E402
from sqlalchemy.dialects import postgresql, sqlite  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from backend.crud import runs as crud  # noqa: E402
from backend.models import Base, RunLog  # noqa: E402
from jobs.spec import parse_spec, resolve_preset  # noqa: E402

SPEC = parse_spec(resolve_preset({"preset": "ddp", "train": {"steps": 2000}}))


def orm_append(db: Session, run_id: str, lines: list[dict]) -> int:
    """The statement on the ORM entity (the code before): the same rows, the same answer."""
    now = crud.utcnow()
    rows = {int(x["seq"]): {"run_id": run_id, "seq": int(x["seq"]),
                            "rank": crud.rank_of(x["line"]), "ts": now, "line": x["line"]}
            for x in lines}
    dialect = {"postgresql": postgresql, "sqlite": sqlite}[db.get_bind().dialect.name]
    stmt = (dialect.insert(RunLog).on_conflict_do_nothing(index_elements=["run_id", "seq"])
            .returning(RunLog.seq))
    added = set(db.scalars(stmt, [rows[s] for s in sorted(rows)]))
    db.commit()
    return len(added)


def store(db: Session, fn, lines: list[dict], batch: int) -> float:
    run_id = crud.create_run(db, SPEC, owner="bench", tags=[], notes="").id
    c0 = time.process_time()
    n = sum(fn(db, run_id, lines[i:i + batch]) for i in range(0, len(lines), batch))
    cpu = time.process_time() - c0
    assert n == len(lines), (n, len(lines))
    db.execute(delete(RunLog).where(RunLog.run_id == run_id))
    db.commit()
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=4000)
    ap.add_argument("--batch", type=int, nargs="+", default=[20, 200])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--db-url", default=None, help="default: SQLite in a temporary file")
    a = ap.parse_args()
    lines = [{"seq": i, "line": f"[default{i % 2}]:step {i // 2} loss 0.4 time 1.5 ms",
              "ts": None} for i in range(a.lines)]
    with tempfile.TemporaryDirectory() as d:
        eng = create_engine(a.db_url or f"sqlite:///{d}/bench.db")
        Base.metadata.create_all(eng)
        print(f"{eng.dialect.name}, {a.lines:,} lines")
        print("| batch | ORM entity (before) CPU s | table (now) CPU s | now / before |")
        print("|---|---|---|---|")
        with Session(eng) as db:
            for batch in a.batch:
                got: dict[str, list[float]] = {"orm": [], "table": []}
                store(db, crud.append_logs, lines, batch)  # warm: statement caches
                store(db, orm_append, lines, batch)
                for _ in range(a.repeat):
                    got["orm"].append(store(db, orm_append, lines, batch))
                    got["table"].append(store(db, crud.append_logs, lines, batch))
                before, now = (statistics.median(got[k]) for k in ("orm", "table"))
                print(f"| {batch} | {before:.3f} | {now:.3f} | {now / before:.2f}x |")


if __name__ == "__main__":
    main()
