"""A tiny DevTools-protocol client for headless Chromium over a pipe (``--remote-debugging-pipe``).

Standard library only: Chromium reads commands on its fd 3 and writes replies and events on
its fd 4, each a JSON object ended by a NUL byte. ``open_page`` loads a file, waits until
its charts say they are drawn (``data-charts-rendered`` on ``<body>``), and returns what the
page showed: console errors and uncaught exceptions, a DOM probe, and a full-page PNG.

``find_chromium()`` looks at ``$JIANMU_FAST_CHROMIUM``, then ``chromium``,
``chromium-browser``, ``google-chrome`` on ``PATH``; ``None`` when there is none.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["find_chromium", "open_page", "PageResult"]

#: Evaluated in the page after its charts are drawn: the headline cells and, per chart, how
#: many SVG marks (bars, box paths, line and point paths) it holds.
PROBE = r"""
(() => {
  const headline = {};
  document.querySelectorAll('#headline td[data-key]').forEach(td => headline[td.dataset.key] = td.textContent);
  const charts = [...document.querySelectorAll('div.chart')].map(div => ({
    id: div.id,
    title: div.closest('section').querySelector('h2').textContent,
    svg: div.querySelectorAll('svg.main-svg').length,
    marks: div.querySelectorAll('.barlayer .point path, .boxlayer path.box, .scatterlayer .trace path.js-line, .scatterlayer .points path').length,
    xtitle: (div.querySelector('.g-xtitle') || {}).textContent || '',
    ytitle: (div.querySelector('.g-ytitle') || {}).textContent || '',
  }));
  return JSON.stringify({headline, charts, rendered: document.body.getAttribute('data-charts-rendered'),
                         title: document.title, tables: document.querySelectorAll('table').length});
})()
"""


def find_chromium() -> Optional[str]:
    env = os.environ.get("JIANMU_FAST_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    png: bytes = b""


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int) -> None:
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict[str, Any]] = None, session: Optional[str] = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self.w, data):]
        want = self.next_id
        deadline = time.monotonic() + timeout
        while True:
            for reply in self._read(deadline):
                if reply.get("id") == want:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.extend(self._read(deadline))

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the pipe (exit status {self.proc.poll()})")
                self.buf += chunk
        *whole, self.buf = self.buf.split(b"\0")
        return [json.loads(x) for x in whole if x]


def open_page(chromium: str, path: Path, *, width: int = 1200, max_height: int = 4000,
              timeout: float = 60.0) -> PageResult:
    """Load ``path`` in a fresh headless Chromium; see the module docstring."""
    cmd_r, cmd_w = os.pipe()
    res_r, res_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="jianmu-chromium-")

    def child_fds() -> None:  # Chromium reads fd 3, writes fd 4
        os.dup2(cmd_r, 3)
        os.dup2(res_w, 4)

    args = [chromium, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", "--hide-scrollbars", "--mute-audio", "about:blank"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            pass_fds=(3, 4), preexec_fn=child_fds)  # kept open after the dup2
    os.close(cmd_r)
    os.close(res_w)
    pipe = _Pipe(proc, cmd_w, res_r)
    out = PageResult()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            pipe.send(method, session=session)
        pipe.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout)
        deadline = time.monotonic() + timeout
        expr = "document.body && document.body.getAttribute('data-charts-rendered')"
        while time.monotonic() < deadline:
            value = pipe.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                              session=session)["result"].get("value")
            has_charts = pipe.send("Runtime.evaluate", {"expression": "document.querySelectorAll('div.chart').length",
                                                        "returnByValue": True}, session=session)["result"]["value"]
            if value is not None or not has_charts:
                break
            time.sleep(0.1)
        probe = pipe.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=session)
        out.probe = json.loads(probe["result"]["value"])
        metrics = pipe.send("Page.getLayoutMetrics", session=session)
        height = min(int(metrics["cssContentSize"]["height"]), max_height)
        pipe.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        time.sleep(0.3)  # let responsive charts settle at the new size
        shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                         session=session)
        out.png = base64.b64decode(shot["data"])
        for e in pipe.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                out.errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                                for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.errors.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        try:
            pipe.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError):
            pass
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(cmd_w)
        os.close(res_r)
        shutil.rmtree(profile, ignore_errors=True)
    return out
