"""Take docs/webui/prefill.png and docs/webui/answer.png: the chat page on the default model,
mid-prefill of a ~3,000-token prompt and with an answer, in headless chromium.

    make webui-screenshots      (or: .venv/bin/python scripts/webui_screenshots.py [--out DIR])
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUESTION = "Write a Python function that reverses a string, with a one-line explanation."
LONG = ("Summarise the following notes in one sentence.\n\n"
        + "The engine admits a prompt in pieces, so other streams keep decoding while it is prefilled. " * 170)
LOAD_TIMEOUT_S = 300


def start_server() -> tuple[subprocess.Popen, str]:
    """`mlxcel-py serve` on the default model, port 0; returns the process and its URL once ready."""
    cmd = [sys.executable, "-m", "mlxcel_py", "serve", "--port", "0", "-np", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "400"})
    found: dict[str, str] = {}
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            match = re.search(r"ready: serving .* on (http://[\d.]+:\d+)", line)
            if match:
                found["url"] = match.group(1)
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(LOAD_TIMEOUT_S):
        proc.kill()
        raise SystemExit("the server did not start")
    return proc, found["url"]


def ask(page, text: str, settings: dict[str, str]) -> None:
    page.get_by_role("button", name="Settings").click()
    for name, value in settings.items():
        page.locator(f'#settings [name="{name}"]').fill(value)
    page.get_by_role("button", name="Settings").click()
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def shoot(url: str, out: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 760}, color_scheme="light")
        page.goto(url + "/")
        page.get_by_text("ready").wait_for(timeout=60_000)
        page.get_by_role("button", name="Server").click()
        ask(page, QUESTION, {"temperature": "0", "max_tokens": "160"})
        page.locator('[data-role="assistant"] .stats').filter(has_text="tokens").wait_for(timeout=120_000)
        page.locator('#slots tr[data-state="decode"]').wait_for(state="detached", timeout=10_000)
        page.screenshot(path=str(out / "answer.png"))
        page.get_by_role("button", name="New conversation").click()
        ask(page, LONG, {"max_tokens": "32"})
        page.wait_for_function("""() => {
            const bar = document.querySelector('[role="progressbar"][aria-valuenow]');
            return bar && Number(bar.getAttribute('aria-valuenow')) < Number(bar.getAttribute('aria-valuemax'))
                && !/^0 \//.test(document.querySelector('#slots tr[data-state="prefill"] td:nth-child(3)')?.textContent ?? "0 /");
        }""", timeout=120_000, polling=50)
        page.screenshot(path=str(out / "prefill.png"))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "webui")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    proc, url = start_server()
    try:
        shoot(url, args.out)
    finally:
        proc.terminate()
        proc.wait(30)
    for name in ("answer.png", "prefill.png"):
        print(args.out / name, (args.out / name).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
