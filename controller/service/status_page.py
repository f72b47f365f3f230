"""The controller's status page over HTTP: runs, their state, reward and accuracy curves.

Plain server-rendered HTML (no JavaScript; the page reloads itself every few seconds) with the
curves drawn as inline SVG, from the run records (controller/service/records.py):

- `/`             every run: state, steps, latest reward and held-out accuracy, a reward sparkline;
- `/runs/<id>`    one run: its record, reward (`critic/score/mean`) and accuracy (`val/accuracy`)
                  curves, latest metrics and recent log lines;
- `/api/runs`, `/api/runs/<id>`  the same as JSON.

Served by the standard library's threading HTTP server on a thread of the controller.
"""
from __future__ import annotations

import html
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from tandem.controller.service.records import Records, RunRecord

REWARD, ACCURACY = "critic/score/mean", "val/accuracy"
REFRESH_S = 5
_STATE_COLOURS = {"queued": "#6b7280", "running": "#2563eb", "succeeded": "#15803d", "failed": "#b91c1c",
                  "cancelled": "#a16207"}
_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#111}table{border-collapse:collapse}
td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left;font-size:14px}
.state{color:#fff;border-radius:4px;padding:1px 6px;font-size:12px}.charts{display:flex;gap:24px;flex-wrap:wrap}
pre{background:#f6f6f6;padding:8px;font-size:12px;max-height:320px;overflow:auto}h1 a{color:inherit}"""


def series(step_metrics: dict[int, dict], key: str) -> list[tuple[int, float]]:
    return [(step, m[key]) for step, m in sorted(step_metrics.items()) if key in m]


def svg_chart(points: list[tuple[int, float]], title: str, width: int = 460, height: int = 200,
              colour: str = "#2563eb", spark: bool = False) -> str:
    """A line chart (dots at the points) with its title and axis ranges; 'no data yet' without
    points. spark: a small one without title and labels (the runs table)."""
    pad_l, pad_r, pad_t, pad_b = (2, 2, 2, 2) if spark else (44, 12, 24, 28)
    kind = "spark" if spark else "chart"
    out = [f'<svg class="{kind}" data-key="{html.escape(title)}" width="{width}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg">']
    if not spark:
        out.append(f'<text x="{pad_l}" y="16" font-size="13">{html.escape(title)}</text>')
    x0, x1, y0, y1 = pad_l, width - pad_r, height - pad_b, pad_t
    out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#fafafa" stroke="#ccc"/>')
    if not points:
        out.append(f'<text x="{(x0 + x1) // 2 - 30}" y="{(y0 + y1) // 2}" font-size="12" fill="#888">no data yet'
                   "</text></svg>")
        return "".join(out)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    lo, hi = min(ys), max(ys)
    lo, hi = (lo - 0.5, hi + 0.5) if hi == lo else (lo, hi)
    xlo, xhi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def px(x, y):
        return x0 + (x - xlo) / (xhi - xlo) * (x1 - x0), y0 - (y - lo) / (hi - lo) * (y0 - y1)

    coords = [px(x, y) for x, y in points]
    out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
               + " ".join(f"{a:.1f},{b:.1f}" for a, b in coords) + '"/>')
    out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{1.5 if spark else 2.5}" fill="{colour}"/>' for a, b in coords]
    if spark:
        return "".join(out) + "</svg>"
    out.append(f'<text x="4" y="{y1 + 10}" font-size="11">{hi:.3g}</text>'
               f'<text x="4" y="{y0}" font-size="11">{lo:.3g}</text>'
               f'<text x="{x0}" y="{height - 8}" font-size="11">step {xlo}</text>'
               f'<text x="{x1 - 50}" y="{height - 8}" font-size="11">step {xhi}</text></svg>')
    return "".join(out)


def _state(record: RunRecord) -> str:
    label = record.state + (" (cancelling)" if record.cancel_requested and not record.ended else "")
    return (f'<span class="state state-{record.state}" style="background:{_STATE_COLOURS[record.state]}">'
            f"{html.escape(label)}</span>")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>{body}</body></html>")


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("-" if value is None else html.escape(str(value)))


def runs_page(records: Records) -> str:
    rows = []
    for r in records.list():
        metrics = records.step_metrics(r.id)
        reward, acc = series(metrics, REWARD), series(metrics, ACCURACY)
        rows.append(f'<tr class="run" id="run-{html.escape(r.id)}"><td><a href="/runs/{html.escape(r.id)}">'
                    f"{html.escape(r.id)}</a></td><td>{_state(r)}</td><td>{r.last_step}/{r.total_steps}</td>"
                    f"<td>{_fmt(reward[-1][1] if reward else None)}</td><td>{_fmt(acc[-1][1] if acc else None)}</td>"
                    f"<td>{svg_chart(reward, 'reward', 140, 32, spark=True) if reward else '-'}</td>"
                    f"<td>{_when(r.created)}</td><td>{html.escape(r.run_dir or '-')}</td></tr>")
    table = ("<table><tr><th>run</th><th>state</th><th>step</th><th>reward</th><th>val accuracy</th>"
             "<th>reward curve</th><th>submitted</th><th>run directory</th></tr>" + "".join(rows) + "</table>")
    counts = {s: sum(1 for r in records.list() if r.state == s) for s in _STATE_COLOURS}
    summary = " · ".join(f"{n} {s}" for s, n in counts.items() if n)
    return _page("Tandem runs", f"<h1>Tandem runs</h1><p>{summary or 'no runs yet'}</p>" + table)


def run_page(records: Records, record: RunRecord) -> str:
    metrics = records.step_metrics(record.id)
    step, latest = records.latest_metrics(record.id)
    details = [("state", _state(record)), ("experiment", html.escape(record.experiment)),
               ("step", f"{record.last_step}/{record.total_steps}"), ("submitted", _when(record.created)),
               ("started", _when(record.started)), ("finished", _when(record.finished)),
               ("run directory", html.escape(record.run_dir or "-")),
               ("resumed from", html.escape(record.resumed_from or "-")), ("error", html.escape(record.error or "-"))]
    body = [f'<h1><a href="/">Tandem runs</a> / {html.escape(record.id)}</h1><table>'
            + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in details) + "</table>",
            '<div class="charts">' + svg_chart(series(metrics, REWARD), f"reward ({REWARD})")
            + svg_chart(series(metrics, ACCURACY), f"held-out accuracy ({ACCURACY})", colour="#15803d") + "</div>",
            f"<h2>Latest metrics (step {step})</h2><table>"
            + "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in sorted(latest.items()))
            + "</table>"]
    lines = [e for e in records.events(record.id, limit=100_000) if e.kind != "metrics"][-50:]
    body.append("<h2>Log</h2><pre>" + "\n".join(
        f"{_when(e.time)} step {e.step}: {html.escape(e.body if e.kind == 'log' else 'state ' + e.body)}"
        for e in lines) + "</pre>")
    return _page(f"Tandem run {record.id}", "".join(body))


def _json(records: Records, run_id: str | None) -> object:
    if run_id is None:
        return [{"id": r.id, "state": r.state, "last_step": r.last_step, "total_steps": r.total_steps}
                for r in records.list()]
    record = records.get(run_id)
    if record is None:
        return None
    metrics = records.step_metrics(run_id)
    return {"id": record.id, "state": record.state, "reward": series(metrics, REWARD),
            "accuracy": series(metrics, ACCURACY)}


def _handler(records: Records):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # the name http.server calls
            path = unquote(self.path.split("?", 1)[0]).rstrip("/") or "/"
            if path == "/":
                return self._send(200, "text/html", runs_page(records))
            if path.startswith("/runs/"):
                record = records.get(path[len("/runs/"):])
                if record is not None:
                    return self._send(200, "text/html", run_page(records, record))
            elif path in ("/api/runs",) or path.startswith("/api/runs/"):
                found = _json(records, path[len("/api/runs/"):] if path.startswith("/api/runs/") else None)
                if found is not None:
                    return self._send(200, "application/json", json.dumps(found))
            return self._send(404, "text/plain", f"no page {path}")

        def _send(self, code: int, kind: str, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # no access log on stderr
            pass

    return Handler


def start_status_page(records: Records, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serve the pages on a daemon thread -> the server (`.server_port`; `.shutdown()` stops it)."""
    httpd = ThreadingHTTPServer((host, port), _handler(records))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="tandem-status-page", daemon=True).start()
    return httpd
