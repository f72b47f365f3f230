"""The status page's HTML: a curve per metric with one point per logged step, states shown,
and text from records escaped (no markup injection through a run's log or error)."""
import re
import urllib.request

from tandem.controller.service.records import Records, RunRecord
from tandem.controller.service.status_page import run_page, runs_page, start_status_page, svg_chart


def test_svg_chart_has_a_point_per_step():
    svg = svg_chart([(1, 0.1), (2, 0.4), (3, 0.2)], "reward")
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    assert len(points) == 3 and svg.count("<circle") == 3
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[1] < ys[2] < ys[0]  # higher values are drawn higher (smaller y)
    assert "no data yet" in svg_chart([], "reward") and "<polyline" not in svg_chart([], "reward")


def test_pages_show_runs_and_escape_their_text(tmp_path):
    db = Records(str(tmp_path))
    db.add(RunRecord(id="r<1>", state="queued", config_yaml="{}", created=1.0, total_steps=3))
    db.set_state("r<1>", "running")
    for step, score in ((1, 0.2), (2, 0.5)):
        db.metrics("r<1>", step, {"critic/score/mean": score})
    db.metrics("r<1>", 2, {"val/accuracy": 0.5})
    db.log("r<1>", 2, "<script>alert(1)</script>")
    db.set_state("r<1>", "failed", error="<b>boom</b>")
    listing, page = runs_page(db), run_page(db, db.get("r<1>"))
    assert "r&lt;1&gt;" in listing and "state-failed" in listing and "<script>" not in page + listing
    assert "&lt;b&gt;boom&lt;/b&gt;" in page
    assert page.count("<polyline") == 2  # reward and accuracy curves

    httpd = start_status_page(db)
    try:
        base = f"http://127.0.0.1:{httpd.server_port}"
        assert "state-failed" in urllib.request.urlopen(base + "/").read().decode()
        api = urllib.request.urlopen(base + "/api/runs/r%3C1%3E").read().decode()
        assert '"reward": [[1, 0.2], [2, 0.5]]' in api
        try:
            urllib.request.urlopen(base + "/runs/nope")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        else:
            raise AssertionError("an unknown run must answer 404")
    finally:
        httpd.shutdown()
