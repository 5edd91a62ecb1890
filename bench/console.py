"""Web console benchmark (issue 28): first paint of a run with 1,000 steps and of a listing of
100,000 runs in headless Chromium, and the gateway's memory per open console tab.

Run from the repository root::

    python -m bench.console                   # ~2 min
    python -m bench.console --steps 1000 --runs 100000 --tabs 200 --loads 7

It starts its own ``EmbeddedServer`` (free loopback port, temp dir) and, on one prefix, a
worker (``python -m tests.apps.run_worker URL PREFIX bench.console 30``) serving
``console_steps`` (N trivial steps), a ``sojourn gateway --port 0`` process, and in this
process a ``ListingService`` on an ``SqliteModel`` filled directly with ``--runs`` views
(``bench.readside.listing_views``: 10 agents, statuses and update times over 7 days).

1. **A run's page**: one run of ``--steps`` steps, completed before timing. ``timeline API``:
   ``GET /ui/api/runs/{id}/timeline`` (the history read and folded by the gateway), 20 times;
   its body's size. ``first paint``: Debian's headless Chromium (Selenium, signed in once)
   loads ``/ui/?n=<i>#/run/<id>`` afresh ``--loads`` times; the figure is the page's own
   ``performance.now()`` (from the navigation's start) in the first animation frame in which
   every step of the run is in the DOM: HTML, scripts, the session check, the timeline's
   request and its render.
2. **The listing**: the same browser loads ``/ui/?n=<i>#/runs`` (no filter: the 50 most
   recently updated of ``--runs``) and ``#/runs?status=waiting``; first paint = the first
   frame with the page's rows. ``listing API``: ``GET /v1/runs?limit=50`` alone.
3. **Open tabs**: ``--tabs`` simulated console tabs on one run's page, each what the page
   holds open: the session cookie and two event streams (``/v1/runs/{id}/events`` and
   ``/v1/runs/{id}/stream``) on a waiting run. The gateway's VmRSS before and once every
   stream has its first byte, over the tab count. (A real tab also polls the timeline every
   5 s; that costs requests, not held memory.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sojourn.actors import Context, agent
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker.connection import Broker
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.config import Settings

from .util import git_state, median, run_bench, summarize

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


async def tick(i: int) -> int:
    return i


@agent("console_steps")
async def console_steps(ctx: Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(tick, i)
    if n == 0:
        await ctx.wait_for("never")  # a run that stays open: the tabs' page
    return total


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class _Proc:
    def __init__(self, args: list[str], ready: bytes) -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.ready = ready
        self.lines: list[bytes] = []

    async def wait_ready(self) -> list[bytes]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
            if not line:
                raise RuntimeError(b"".join(self.lines).decode())
            self.lines.append(line)
            if line.startswith(self.ready):
                return self.lines

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _browser(base: str, token: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path="/usr/bin/chromedriver")
    )
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(120)
    driver.get(base + "/ui/")
    field = WebDriverWait(driver, 60).until(
        lambda d: d.find_element("css selector", "input[name=token]")
    )
    field.send_keys(token)
    driver.find_element("css selector", "form[data-test=signin] button").click()
    WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", "[data-test=who]"))
    return driver


_PAINTED = """
const [selector, count, done] = arguments;
function look() {
  if (document.querySelectorAll(selector).length >= count) done(performance.now());
  else requestAnimationFrame(look);
}
requestAnimationFrame(look);
"""


def _first_paints(driver: Any, url: str, selector: str, count: int, loads: int) -> list[float]:
    out = []
    for i in range(loads + 1):
        driver.get(url.replace("/ui/#", f"/ui/?n={i}#"))
        ms = driver.execute_async_script(_PAINTED, selector, count)
        if i:  # the first load warms the caches (the gateway's, the page cache's)
            out.append(ms / 1000)
    return out


async def _timed(h: httpx.AsyncClient, path: str, n: int) -> tuple[list[float], int]:
    lat = []
    size = 0
    for i in range(n + 2):
        t = time.perf_counter()
        r = await h.get(path)
        r.raise_for_status()
        if i >= 2:
            lat.append(time.perf_counter() - t)
        size = len(r.content)
    return lat, size


async def _tabs(base: str, cookie: dict[str, str], run_id: str, tabs: int, pid: int) -> Any:
    before = _rss_kib(pid)
    limits = httpx.Limits(max_connections=2 * tabs + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, cookies=cookie, timeout=60, limits=limits) as h:
        ready = 0
        all_open = asyncio.Event()

        async def hold(path: str) -> None:
            nonlocal ready
            first = True
            async with h.stream("GET", path) as r:
                r.raise_for_status()
                async for _ in r.aiter_bytes():
                    if first:  # the stream is open: its ": sojourn" comment came
                        first = False
                        ready += 1
                        if ready == 2 * tabs:
                            all_open.set()

        tasks = [
            asyncio.create_task(hold(f"/v1/runs/{run_id}/{kind}"))
            for _ in range(tabs)
            for kind in ("events", "stream")
        ]
        await asyncio.wait_for(all_open.wait(), 120)
        await asyncio.sleep(2)  # settled: what the streams hold, not what opening them took
        after = _rss_kib(pid)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"tabs": tabs, "rss_before_mib": before / 1024, "rss_after_mib": after / 1024,
            "per_tab_kib": (after - before) / tabs}  # fmt: skip


async def main(a: argparse.Namespace) -> dict[str, Any]:
    from bench.readside import listing_views
    from sojourn.actors import Client
    from sojourn.projections.listing import ListingService
    from sojourn.projections.sqlite import SqliteModel

    out: dict[str, Any] = {"git": git_state(ROOT), "args": vars(a)}
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    server = EmbeddedServer(store_dir=tmp / "nats", port=0)
    await server.start()
    settings = Settings(prefix=f"bc{secrets.token_hex(3)}")
    names = Names(settings.prefix)
    token = secrets.token_urlsafe(24)
    (tmp / "tokens").write_text(f"{token} admin bench\n")
    procs: list[_Proc] = []
    broker = await Broker.connect(server.url, name="bench-console")
    client = await Client.connect(server.url, settings=settings)
    model = await SqliteModel.open(tmp / "m.sqlite3", events_stream=names.events_stream)
    service = ListingService(broker, names, model)
    driver = None
    try:
        await ensure_topology(broker, names, settings, consumers=False)
        worker = _Proc(
            [PYTHON, "-m", "tests.apps.run_worker", server.url, settings.prefix, "bench.console",
             "30"], b"ready",
        )  # fmt: skip
        procs.append(worker)
        await worker.wait_ready()
        gateway = _Proc(
            [PYTHON, "-m", "sojourn.actors.cli", "gateway", "--port", "0", "--nats", server.url,
             "--prefix", settings.prefix, "--tokens", str(tmp / "tokens")], b"ready",
        )  # fmt: skip
        procs.append(gateway)
        lines = await gateway.wait_ready()
        base = next(ln.split()[1].decode() for ln in lines if ln.startswith(b"gateway: "))
        print(f"filling the listing with {a.runs:,} runs", flush=True)
        now = time.time()
        items = listing_views(a.runs, now)
        for i in range(0, len(items), 5000):
            await model.apply(items[i : i + 5000])
        await service.start()
        print(f"a run of {a.steps} steps", flush=True)
        long_run = await client.start("console_steps", a.steps, run_id="long-run", wait=True)
        await client.result(long_run, timeout=600)
        open_run = await client.start("console_steps", 0, run_id="open-run", wait=True)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as h:
            lat, size = await _timed(h, "/ui/api/runs/long-run/timeline", 20)
            out["timeline_api"] = {**summarize(lat), "bytes": size}
            lat, size = await _timed(h, "/v1/runs?limit=50", 20)
            out["listing_api"] = {**summarize(lat), "bytes": size}
            signed = await h.post("/ui/session", json={"token": token}, headers={})
            cookie = {"sojourn_session": signed.cookies["sojourn_session"]}
        print("first paints in Chromium", flush=True)
        driver = await asyncio.to_thread(_browser, base, token)
        paints = await asyncio.to_thread(
            _first_paints, driver, f"{base}/ui/#/run/long-run", "li[data-kind=step]",
            a.steps, a.loads,
        )  # fmt: skip
        out["run_first_paint"] = {**summarize(paints), "median": median(paints)}
        rows = "table[data-test=runs] tbody tr"
        paints = await asyncio.to_thread(
            _first_paints, driver, f"{base}/ui/#/runs", rows, 50, a.loads
        )
        out["listing_first_paint"] = {**summarize(paints), "median": median(paints)}
        paints = await asyncio.to_thread(
            _first_paints, driver, f"{base}/ui/#/runs?status=waiting", rows, 50, a.loads
        )
        out["listing_waiting_first_paint"] = {**summarize(paints), "median": median(paints)}
        print(f"{a.tabs} open tabs", flush=True)
        out["tabs"] = await _tabs(base, cookie, open_run, a.tabs, gateway.proc.pid)
    finally:
        if driver is not None:
            await asyncio.to_thread(driver.quit)
        await service.stop()
        await model.close()
        await client.close()
        await broker.close()
        for p in procs:
            p.stop()
        await server.stop()
    for key, value in out.items():
        print(f"{key}: {value}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    p.add_argument("--steps", type=int, default=1000, help="steps of the run (default 1000)")
    p.add_argument("--runs", type=int, default=100_000, help="runs listed (default 100000)")
    p.add_argument("--tabs", type=int, default=200, help="open console tabs (default 200)")
    p.add_argument("--loads", type=int, default=7, help="page loads timed (default 7)")
    p.add_argument("--json", help="write the figures to this file")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    run_bench(main(args), args.json)
