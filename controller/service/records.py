"""Run records and run events in SQLite: one file (STATE_DIR/runs.sqlite) per controller.

A record is a submitted run: id, resolved config, state (queued -> running -> succeeded |
failed | cancelled), timestamps, run directory, last step, final summary, error. Events are a
run's metrics (one row per logged step) and log lines, numbered over all runs (`seq`), so a
follower can reconnect after the last one it saw. Every change is one transaction: a
controller killed at any point leaves the records it had committed.

One connection, used under a lock from the controller's threads (the gRPC loop, the run
thread, the status page's HTTP threads). Deliberately not here: what the states mean for
the services (controller/service/queue.py).
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field

DB_FILE = "runs.sqlite"
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
ENDED = ("succeeded", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, state TEXT NOT NULL, source TEXT, overrides TEXT, config_yaml TEXT NOT NULL,
  experiment TEXT, created REAL NOT NULL, started REAL DEFAULT 0, finished REAL DEFAULT 0,
  run_dir TEXT DEFAULT '', last_step INTEGER DEFAULT 0, total_steps INTEGER DEFAULT 0,
  summary_json TEXT DEFAULT '', error TEXT DEFAULT '', cancel_requested INTEGER DEFAULT 0,
  resume_from TEXT DEFAULT '', resumed_from TEXT DEFAULT '', service_pids_json TEXT DEFAULT '');
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, time REAL NOT NULL,
  step INTEGER NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, seq);
"""


@dataclass
class RunRecord:
    id: str
    state: str
    config_yaml: str
    created: float
    source: str = ""
    overrides: list = field(default_factory=list)
    experiment: str = ""
    started: float = 0.0
    finished: float = 0.0
    run_dir: str = ""
    last_step: int = 0
    total_steps: int = 0
    summary_json: str = ""
    error: str = ""
    cancel_requested: bool = False
    resume_from: str = ""  # a restarted controller continues the run from this checkpoint
    resumed_from: str = ""  # the checkpoint the run did continue from
    service_pids_json: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclass
class Event:
    seq: int
    run_id: str
    time: float
    step: int
    kind: str  # log | metrics | state
    body: str  # the line, the state, or the metrics as JSON

    @property
    def metrics(self) -> dict:
        return json.loads(self.body) if self.kind == "metrics" else {}


class Records:
    def __init__(self, state_dir: str):
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, DB_FILE)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- records ---------------------------------------------------------------------------

    def add(self, record: RunRecord) -> RunRecord:
        row = asdict(record)
        row["overrides"] = json.dumps(record.overrides)
        row["cancel_requested"] = int(record.cancel_requested)
        self._write(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
        self.log(record.id, 0, f"queued ({record.source or 'defaults'}"
                                f"{' ' + ' '.join(record.overrides) if record.overrides else ''})")
        return record

    def get(self, run_id: str) -> RunRecord | None:
        rows = self._read("SELECT * FROM runs WHERE id = ?", (run_id,))
        return _record(rows[0]) if rows else None

    def list(self, limit: int = 0, states: tuple[str, ...] = STATES) -> list[RunRecord]:
        """Newest first."""
        sql = f"SELECT * FROM runs WHERE state IN ({', '.join('?' * len(states))}) ORDER BY created DESC, rowid DESC"
        rows = self._read(sql + (" LIMIT ?" if limit else ""), (*states, *([limit] if limit else [])))
        return [_record(r) for r in rows]

    def next_queued(self) -> RunRecord | None:
        """The oldest queued run (FIFO; a run requeued after a controller restart is older than any other)."""
        rows = self._read("SELECT * FROM runs WHERE state = 'queued' ORDER BY created, rowid LIMIT 1")
        return _record(rows[0]) if rows else None

    def update(self, run_id: str, **values) -> None:
        if "cancel_requested" in values:
            values["cancel_requested"] = int(values["cancel_requested"])
        sets = ", ".join(f"{k} = ?" for k in values)
        self._write(f"UPDATE runs SET {sets} WHERE id = ?", (*values.values(), run_id))

    def set_state(self, run_id: str, state: str, *, only_from: tuple[str, ...] = STATES, **values) -> bool:
        """Move a run to `state` if it is in one of `only_from` (one transaction) -> whether it moved."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}; known: {STATES}")
        now = time.time()
        if state == "running":
            values.setdefault("started", now)
        if state in ENDED:
            values.setdefault("finished", now)
        if "cancel_requested" in values:
            values["cancel_requested"] = int(values["cancel_requested"])
        sets = ", ".join(f"{k} = ?" for k in ("state", *values))
        with self._lock:  # the state and its event together: a reader sees both or neither
            self._db.execute("BEGIN IMMEDIATE")
            try:
                moved = self._db.execute(
                    f"UPDATE runs SET {sets} WHERE id = ? AND state IN ({', '.join('?' * len(only_from))})",
                    (state, *values.values(), run_id, *only_from)).rowcount
                if moved:
                    self._db.execute("INSERT INTO events (run_id, time, step, kind, body) SELECT id, ?, last_step, "
                                     "'state', ? FROM runs WHERE id = ?", (now, state, run_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return bool(moved)

    # ---- events ----------------------------------------------------------------------------

    def _event(self, run_id: str, step: int, kind: str, body: str) -> None:
        self._write("INSERT INTO events (run_id, time, step, kind, body) VALUES (?, ?, ?, ?, ?)",
                    (run_id, time.time(), step, kind, body))

    def log(self, run_id: str, step: int, line: str) -> None:
        self._event(run_id, step, "log", line)

    def metrics(self, run_id: str, step: int, values: dict) -> None:
        self._event(run_id, step, "metrics", json.dumps(values))
        self._write("UPDATE runs SET last_step = ? WHERE id = ? AND last_step < ?", (step, run_id, step))

    def events(self, run_id: str, from_step: int = 0, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        rows = self._read("SELECT * FROM events WHERE run_id = ? AND step >= ? AND seq > ? ORDER BY seq LIMIT ?",
                          (run_id, from_step, after_seq, limit))
        return [Event(r["seq"], r["run_id"], r["time"], r["step"], r["kind"], r["body"]) for r in rows]

    def step_metrics(self, run_id: str) -> dict[int, dict]:
        """{step: metrics}, later events of a step merged over earlier ones (a resumed run redoes steps)."""
        out: dict[int, dict] = {}
        for r in self._read("SELECT step, body FROM events WHERE run_id = ? AND kind = 'metrics' ORDER BY seq",
                            (run_id,)):
            out.setdefault(r["step"], {}).update(json.loads(r["body"]))
        return out

    def latest_metrics(self, run_id: str) -> tuple[int, dict]:
        """(the last logged step, its metrics: the step's and its validation's, merged)."""
        rows = self._read("SELECT step FROM events WHERE run_id = ? AND kind = 'metrics' ORDER BY seq DESC LIMIT 1",
                          (run_id,))
        if not rows:
            return 0, {}
        step, out = rows[0]["step"], {}
        for r in self._read("SELECT body FROM events WHERE run_id = ? AND kind = 'metrics' AND step = ? ORDER BY seq",
                            (run_id, step)):
            out.update(json.loads(r["body"]))
        return step, out


def _record(row: sqlite3.Row) -> RunRecord:
    values = dict(row)
    values["overrides"] = json.loads(values["overrides"] or "[]")
    values["cancel_requested"] = bool(values["cancel_requested"])
    return RunRecord(**values)
