"""`capo report` comparing runs, rendered in headless Chromium (Debian package `chromium`)."""

import json
import re
import shutil
import subprocess

import pytest

from capo.cli import main
from capo.evaluation import plots
from capo.evaluation.metrics import compute_metrics
from capo.evaluation.run import atomic_write_text

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def fake_eval_run(d, shift: float, seed: int):
    import random

    rng = random.Random(seed)
    rows = []
    for p in range(12):
        for j in range(4):
            ok = rng.random() < 0.5
            lp = -abs(rng.gauss(0.6 - (shift if ok else 0), 0.3))
            rows.append({"prompt_id": f"p{p}", "sample_idx": j, "text": f"<b>t{p}{j}</b><script>alert(1)</script>",
                         "prompt": "What is 1 < 2 & 3?", "gold": "1", "answer": "1" if ok else "2",
                         "verdict": "correct" if ok else "incorrect", "mean_logprob": lp, "n_tokens": 9,
                         "answer_id": 0 if ok else 1, "confidence": None, "finish_reason": "stop",
                         "token_logprobs": [lp] * 9, "token_entropy": [rng.random() for _ in range(9)],
                         "token_kl_uniform": [rng.random() for _ in range(9)],
                         "token_topk_conf": [rng.random() for _ in range(9)]})
    res = compute_metrics(rows, n_boot=20)
    d.mkdir(parents=True)
    atomic_write_text(d / "metrics.json", json.dumps({"config": {"model": "m", "k": 4}, **res}))
    (d / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _sentences(text: str) -> list[str]:
    """Sentences of the conclusion: a full stop followed by a space and a capital or a digit starts the next."""
    return [x for x in re.split(r"(?<=[.])\s+(?=[A-Z0-9])", " ".join(text.split())) if x]


# appended to a copy of the report: after layout, write each figure's rendered and natural size, the forest plot's
# and a table cell's font size into the DOM that --dump-dom prints
MEASURE_JS = """<script>window.addEventListener('load', () => {
  const figs = [...document.images].map(i => ({alt: i.alt, w: i.getBoundingClientRect().width,
                                               nat: i.naturalWidth}));
  const td = parseFloat(getComputedStyle(document.querySelector('table.metrics td')).fontSize);
  const pre = document.createElement('pre'); pre.id = 'measured';
  pre.textContent = JSON.stringify({figs, td, body: document.body.getBoundingClientRect().width});
  document.body.appendChild(pre);
});</script>"""


def fake_train_run(d):
    d.mkdir(parents=True)
    rows = [{"step": s, "train/reward": 0.1 * s, "calib/auc_mean": 0.5 + 0.02 * s} for s in range(1, 6)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "tor')
    return d


@pytest.fixture()
def report(tmp_path):
    a = fake_eval_run(tmp_path / "base", 0.0, 1)
    b = fake_eval_run(tmp_path / "capo", 0.4, 2)
    c = fake_eval_run(tmp_path / "grpo", 0.2, 3)  # a third model: the forest plot needs two against the reference
    t = fake_train_run(tmp_path / "train")
    out = tmp_path / "cmp.html"
    assert main(["report", str(a), str(b), str(c), str(t), "--out", str(out), "--examples", "2"]) == 0
    return out


FIGURES = ("accuracy vs AUC-mean", "precision-coverage curve", "reliability diagrams")


def test_report_content(report, tmp_path):
    html = report.read_text()
    assert html.count("data:image/png;base64,") >= 4  # the three figures + a training curve
    for alt in FIGURES:
        assert f'alt="{alt}"' in html, alt
    assert html.count("<table") >= 5
    assert "<script>" not in html  # model text is escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for name in ("base", "capo", "grpo", "train"):
        assert f"<th>{name}</th>" in html
    # the headline comes first and is computed from the numbers
    assert html.index("id='headline'") < html.index("<img") < html.index("<table")
    acc = {n: json.loads((tmp_path / n / "metrics.json").read_text())["metrics"]["accuracy"]
           for n in ("base", "capo", "grpo")}
    best, second, _ = sorted(acc, key=lambda n: -acc[n])
    head = re.sub(r"<[^>]+>", "", html[html.index("id='headline'"):html.index("</p>", html.index("id='headline'"))])
    if best != "base":  # the reference is base: the best model against it
        assert f"{best} has the highest accuracy ({acc[best]:.3f}), {acc[best] - acc['base']:+.3f} vs base" in head
    else:
        assert f"No model beats base on accuracy ({acc['base']:.3f}); the next, {second}, is " in head
    assert "95% interval [" in head and ("excludes 0" in head or "includes 0" in head)
    assert "AUC-mean" in head and "not over training seeds" in head
    assert len(_sentences(head)) <= 3, _sentences(head)
    assert "Paired differences against base" in html and "training seed" in html
    assert "&uarr;" in html and "&darr;" in html and 'class="best"' in html
    assert "<td>48</td>" in html and "48.0" not in html  # counts as integers (12 prompts x 4 responses)


def test_report_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "neither metrics.json" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()
    # JSON of the wrong shape: named, exit 2 (an AttributeError traceback before)
    (tmp_path / "evalrun").mkdir()
    (tmp_path / "evalrun" / "metrics.json").write_text("[1, 2]")
    assert main(["report", str(tmp_path / "evalrun"), "--out", str(tmp_path / "r.html")]) == 2
    assert "metrics.json: not a capo eval result" in capsys.readouterr().err
    (tmp_path / "trainrun").mkdir()
    (tmp_path / "trainrun" / "metrics.jsonl").write_text('{"step": 1, "train/accuracy": 0.5}\n[1]\n')
    assert main(["report", str(tmp_path / "trainrun"), "--out", str(tmp_path / "r.html")]) == 2
    assert "metrics.jsonl line 2: not a metrics row" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
            "--enable-logging=stderr", "--v=0"]
    url = report.resolve().as_uri()
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count("<img") >= 4 and "data:image/png;base64," in html
    assert html.count("<table") >= 5
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == [], console
    assert "id=\"headline\"" in html or "id='headline'" in html
    for alt in FIGURES:
        assert f'alt="{alt}"' in html, alt
    # the confidence-estimator tables (one per metric across the two models), every estimator the rows allow
    assert "<h2>Confidence estimators</h2>" in html and html.count("class=\"metrics estimators\"") == 7
    for name in ("lpm", "sum_logprob", "min_token_prob", "neg_entropy", "self_certainty", "tail", "bottom_group",
                 "lowest_group", "consistency"):
        assert f"<th class=\"l\">{name}</th>" in html, name
    # rendered sizes: every figure is shown (not collapsed), the forest plot at full width, and its text (points at the
    # PNG's dpi, scaled by the rendered / natural width) at least as large as a table cell's text
    measured_page = tmp_path / "measured.html"
    measured_page.write_text(report.read_text().replace("</body>", MEASURE_JS + "</body>"))
    dom2 = subprocess.run(base + ["--window-size=1280,2400", "--dump-dom", measured_page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    m = json.loads(re.search(r"<pre id=\"measured\">(.*?)</pre>", dom2.stdout, re.S).group(1).replace("&quot;", '"'))
    assert all(f["w"] >= 300 for f in m["figs"]), m["figs"]
    forest = [f for f in m["figs"] if f["alt"] == "paired differences"]
    assert len(forest) == 1 and forest[0]["w"] >= 0.9 * min(m["body"], 1100), (m["figs"], m["body"])
    text_px = plots.FOREST_FONT_PT * 110 / 72 * forest[0]["w"] / forest[0]["nat"]
    assert text_px >= m["td"], (text_px, m["td"])
    shot = tmp_path / "report.png"  # left in the test's temporary folder for a developer to open
    r = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1280,2400", url], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    print(f"screenshot: {shot}")
    # the screenshot is not blank: many distinct colours (plots rendered)
    from PIL import Image

    im = Image.open(shot).convert("RGB").resize((320, 600))
    assert len(im.getcolors(maxcolors=1_000_000)) > 50
