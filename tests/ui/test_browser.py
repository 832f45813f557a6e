"""The Airflow UI as a newcomer meets it, in headless Chromium (Debian's, driven by Playwright; no browser
download): log in, open the Graph and the Grid, open the trigger form, check it refuses what the server refuses
without clamping, trigger a short run from it (the tiny model; the server plants a failed lossless gate after
evaluate wrote report.json), then check the run's state in the UI is its tasks' verdict, and that its
"EAGLE-3 report" tab names the failed task and lays out without overlapping boxes at 1280 and 1920 px.
No api-server call may fail, other than the one trigger the form must refuse. Screenshots: test-artifacts/ui/.
"""

from __future__ import annotations

import shutil
import urllib.parse
from pathlib import Path

import pytest

from tests.airflow.tiny_data import write_tiny_manifest
from tests.ui.conftest import wait_for_run

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# Blocks that must not overlap on the report page (inside a .scroll box, a table may be wider than the page).
OVERLAPS_JS = """() => {
  const sel = 'h1, h2, h3, p, ul, pre, .scroll, .na, figure, .status, details, #run-status, .failed-task';
  const els = [...document.querySelectorAll(sel)].filter(e => e.getClientRects().length);
  const boxes = els.map(e => [e, e.getBoundingClientRect()]);
  const bad = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, ra] = boxes[i], [b, rb] = boxes[j];
    if (a.contains(b) || b.contains(a)) continue;
    const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
    const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
    if (w > 1 && h > 1) bad.push([a.tagName + '#' + a.id + '.' + a.className, b.tagName + '#' + b.id + '.' + b.className,
                                  Math.round(w), Math.round(h)]);
  }
  const doc = document.documentElement;
  return {bad, pageWidth: doc.scrollWidth, viewWidth: doc.clientWidth};
}"""


def tiny_form_values(model: str, manifest: Path) -> dict[str, str]:
    """What the test types into the form: the tiny model and data, sizes that take seconds."""
    return {"model": model, "manifest": str(manifest), "max_seq_len": "256", "draft_vocab_size": "512",
            "ttt_length": "2", "epochs": "1", "max_steps": "4", "extract_token_budget": "512",
            "train_token_budget": "512", "extract_shards": "1", "benchmark_prompts": "humaneval",
            "benchmark_limit": "2", "max_new_tokens": "12", "steps": "2"}


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _open_trigger_form(page, base: str):
    page.goto(f"{base}/dags/eagle3_train")
    page.get_by_role("button", name="Trigger Dag").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[name=element_model]").wait_for(timeout=60_000)
    return dialog


def _fill(dialog, name: str, value: str) -> None:
    field = dialog.locator(f"input[name=element_{name}]")
    field.fill(value)
    field.press("Tab")


def check_form(page, ui) -> None:
    """Help as Markdown, no placeholders, and refusals the server makes shown in the dialog, nothing clamped."""
    dialog = _open_trigger_form(page, ui.base)
    text = dialog.inner_text()
    assert "``" not in text, "RST literals in the form's help"
    assert "null" not in text.split("Advanced Options")[0], "a literal null in the form"
    assert dialog.locator("input[name=element_aux_layers]").input_value() == ""  # empty: the target's default
    assert dialog.locator("#element_regenerate_server").inner_text().strip() == "vLLM"
    _shot(page, "trigger_form")
    runs_before = ui.get("/api/v2/dags/eagle3_train/dagRuns")["total_entries"]
    _fill(dialog, "max_seq_len", "-5")
    assert dialog.locator("input[name=element_max_seq_len]").input_value() == "-5", "clamped silently"
    dialog.get_by_role("button", name="Trigger").click()
    dialog.get_by_text("Invalid input for param max_seq_len").wait_for(timeout=30_000)
    assert "-5 is less than the minimum of 16" in dialog.inner_text()
    _shot(page, "trigger_form_refused")
    page.keyboard.press("Escape")
    dialog = _open_trigger_form(page, ui.base)  # a fresh form: the error shown blocks the Trigger button
    _fill(dialog, "epochs", "1.5")
    dialog.get_by_role("button", name="Trigger").click()
    dialog.get_by_text("Invalid input for param epochs").wait_for(timeout=30_000)
    assert "1.5 is not of type 'integer'" in dialog.inner_text()
    page.keyboard.press("Escape")
    assert ui.get("/api/v2/dags/eagle3_train/dagRuns")["total_entries"] == runs_before  # nothing started


def trigger_short_run(page, ui, values: dict[str, str]) -> str:
    dialog = _open_trigger_form(page, ui.base)
    for name, value in values.items():
        _fill(dialog, name, value)
    dialog.locator("textarea[name=element_drop]").fill("")  # the demo's drop list names a demo dataset
    compare = dialog.locator("#element_evaluate_compare_with")
    compare.locator("[aria-label='Remove vllm'] [role=button]").click()  # and no vLLM servers: seconds, not minutes
    _shot(page, "trigger_form_filled")
    dialog.get_by_role("button", name="Trigger").click()
    page.wait_for_url("**/dags/eagle3_train/runs/**", timeout=60_000)
    run_id = urllib.parse.unquote(page.url.split("/runs/")[1].split("/")[0].split("?")[0])
    conf = ui.get(f"/api/v2/dags/eagle3_train/dagRuns/{urllib.parse.quote(run_id, safe='')}")["conf"]
    assert conf["model"] == values["model"] and not conf["drop"] and not conf["evaluate_compare_with"], conf
    return run_id


def check_report_tab(page, base: str, run_id: str) -> None:
    quoted = urllib.parse.quote(run_id, safe="")
    page.goto(f"{base}/dags/eagle3_train/runs/{quoted}/plugin/eagle3-report")
    frame = page.frame_locator("iframe[title='EAGLE-3 report']")
    status = frame.locator("#run-status")
    status.wait_for(timeout=60_000)
    assert "evaluate failed" in status.inner_text() and "planted by tests/airflow/plant" in status.inner_text()
    assert "publish" in frame.locator("#not-run").inner_text()
    assert "FAILED" in frame.locator("#acceptance").inner_text()  # the planted verdict, per engine
    assert not frame.get_by_text("not yet available").count()  # a finished run says why a section is missing
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(1500)
        inner = page.frame(url=lambda u: "/eagle3/runs/" in u)
        inner.evaluate("() => window.scrollTo(0, 0)")
        layout = inner.evaluate(OVERLAPS_JS)
        assert layout["bad"] == [], (width, layout["bad"][:10])
        assert layout["pageWidth"] <= layout["viewWidth"] + 1, (width, layout)  # wide tables scroll in their box
        _shot(page, f"report_tab_{width}")
        inner.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
        _shot(page, f"report_tab_{width}_end")
    for width in (1280, 1920):  # the whole page, outside the tab
        alone = page.context.new_page()
        alone.set_viewport_size({"width": width, "height": 1000})
        alone.goto(f"{base}/eagle3/runs/eagle3_train/{quoted}")
        assert alone.evaluate(OVERLAPS_JS)["bad"] == []
        _shot(alone, f"report_page_{width}")
        alone.close()
    link = frame.locator("#full-report")
    link.click()  # opens inside the tab (the UI's iframe allows no pop-ups)
    page.wait_for_timeout(2000)
    inner = page.frame(url=lambda u: u.endswith("/report.html"))
    assert inner is not None and "EAGLE-3 run report" in inner.content()
    assert '&lt;span class="' not in inner.content()  # markup escaped exactly once
    _shot(page, "full_report_in_tab")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_the_ui_walkthrough_with_a_short_run_from_the_form(airflow_ui, tmp_path, tiny_llama_dir):
    from playwright.sync_api import sync_playwright

    manifest = write_tiny_manifest(tmp_path / "data")
    failed_calls: list[tuple[int, str, str]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
        page.set_default_timeout(60_000)
        page.goto(ui_base := airflow_ui.base)
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", airflow_ui.password)
        page.keyboard.press("Enter")
        page.wait_for_function("() => !location.pathname.includes('login')")
        page.wait_for_load_state("networkidle")
        # From here on, every call to the api-server must succeed (the login page's 401 is before this).
        page.on("response", lambda r: failed_calls.append((r.status, r.request.method, r.url))
                if r.url.startswith(ui_base) and r.status >= 400 else None)

        page.goto(f"{ui_base}/dags/eagle3_train")
        page.get_by_role("button", name="Show Graph (Press g)").click()
        nodes = page.locator(".react-flow__node")
        nodes.first.wait_for()
        names = {n.inner_text().split("\n")[0].split(" [")[0] for n in nodes.all()}
        assert {"discover", "stats", "verify", "train", "evaluate", "report", "outcome"} <= names, names
        _shot(page, "graph")
        page.get_by_role("button", name="Show Grid (Press g)").click()
        page.get_by_text("outcome", exact=True).first.wait_for()
        _shot(page, "grid")

        check_form(page, airflow_ui)
        refused = [c for c in failed_calls if c[0] == 400 and c[1] == "POST" and c[2].endswith("/dagRuns")]
        assert len(refused) == 2, failed_calls  # the two refusals the form had to show
        failed_calls[:] = [c for c in failed_calls if c not in refused]

        run_id = trigger_short_run(page, airflow_ui, tiny_form_values(tiny_llama_dir, manifest))
        state, tis = wait_for_run(airflow_ui, run_id)
        # The run's state is its tasks' verdict: the planted gate failed evaluate, so the run failed.
        assert tis.get("evaluate") == "failed" and tis.get("report") == "success", tis
        assert tis.get("outcome") == "failed" and tis.get("publish") == "upstream_failed", tis
        expected = "failed" if any(s in ("failed", "upstream_failed") for s in tis.values()) else "success"
        assert state == expected == "failed", (state, tis)
        page.goto(f"{ui_base}/dags/eagle3_train/runs/{urllib.parse.quote(run_id, safe='')}")
        page.get_by_text("failed", exact=False).first.wait_for()
        _shot(page, "run")

        check_report_tab(page, ui_base, run_id)
        browser.close()
    assert failed_calls == [], failed_calls
