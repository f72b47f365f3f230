"""Headless Chromium (Debian's chromium + chromium-driver) driven by selenium, for page tests.

The flags are those known to work on these machines: no sandbox as root, no GPU, and no
background networking (a closed network refuses those connections). Screenshots are also
copied to $TANDEM_SHOTS_DIR when it is set (for people to look at).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")


@contextlib.contextmanager
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
        try:
            yield driver
        finally:
            driver.quit()


def save_screenshot(driver, path: Path) -> Path:
    driver.save_screenshot(str(path))
    shots = os.environ.get("TANDEM_SHOTS_DIR")
    if shots:
        os.makedirs(shots, exist_ok=True)
        shutil.copy(path, os.path.join(shots, path.name))
    return path
