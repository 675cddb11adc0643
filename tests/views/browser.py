"""A real headless Chromium (Debian's `chromium` package) driven through the DevTools
protocol over a pipe (`--remote-debugging-pipe`: NUL-separated JSON on file descriptors 3
and 4, as Puppeteer's `pipe: true` uses it), with the standard library only.

    with Browser(chromium_binary()) as b:
        page = b.open(Path("report.html"), width=1280, height=2000)
        page.problems          # console errors, uncaught exceptions, failed loads, CSP violations
        page.evaluate("document.images.length")
        page.screenshot(Path("shot.png"))

Nothing is faked: the page is loaded, laid out, decoded and painted by Chromium itself.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-pipe")


def chromium_binary() -> str:
    """Debian's chromium, installed with apt-get when missing (as the Slurm tests install
    slurm-wlm: CI starts from a fresh machine); one line saying what to do when it cannot be."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("chromium is missing and this is not root: apt-get install chromium")
    lock = Path(tempfile.gettempdir()) / "campaign-chromium-apt.lock"
    cmd = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
           "-o DPkg::Lock::Timeout=600 chromium")
    p = subprocess.run(["flock", str(lock), "sh", "-c", f"command -v chromium || {{ {cmd}; }}"],
                       capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if not found:
        raise RuntimeError(f"apt-get install chromium failed (rc={p.returncode}): {p.stderr[-2000:]}")
    return found


class Page:
    """One tab: what went wrong while it loaded, and a way to look at it."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    @property
    def problems(self) -> list[str]:
        """Console errors (console.error/assert), uncaught exceptions, and the browser's own
        error entries (a resource that failed to load, a CSP violation), as text."""
        out = []
        for m in self.browser.events:
            if m.get("sessionId") != self.session:
                continue
            p = m.get("params", {})
            if m["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"{p['entry']['source']}: {p['entry']['text']} {p['entry'].get('url', '')}".strip())
        return out

    def evaluate(self, expression: str) -> Any:
        r = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True}, self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            h = self.evaluate("document.documentElement.scrollHeight")
            w = self.evaluate("document.documentElement.scrollWidth")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
        r = self.browser.call("Page.captureScreenshot", params, self.session)
        path.write_bytes(base64.b64decode(r["data"]))
        return path


class Browser:
    def __init__(self, binary: str, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._next = 0
        self._buf = b""
        self.profile = tempfile.mkdtemp(prefix="campaign-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4.
        args = " ".join([binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"])
        self.proc = subprocess.Popen(["bash", "-c", f"exec {args} 3<&{to_chrome_r} 4>&{from_chrome_w}"],
                                     pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
                self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait(timeout=20)
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc.stderr:
                self.proc.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        return self._next

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        want = self.send(method, params, session)
        while True:
            m = self._read()
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        for m in self.events:
            if m.get("method") == method and m.get("sessionId") == session:
                return m
        while True:
            m = self._read()
            if m.get("method") == method and m.get("sessionId") == session:
                return m

    def _read(self) -> dict[str, Any]:
        import select

        end = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError(f"no answer from chromium in {self.timeout:g} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()}): {err}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        m = json.loads(raw)
        if "method" in m:
            self.events.append(m)
        return m

    def open(self, path: Path, *, width: int = 1280, height: int = 2000) -> Page:
        """Open `path` (file://) in a new tab of width x height CSS pixels, wait for its load event."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method, {}, session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session)
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session)
