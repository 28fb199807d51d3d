"""Starting the demo's processes on fresh interpreters, and collecting their reports."""

from __future__ import annotations

import multiprocessing
import queue
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from sessionrepo.demo.gateway import GATEWAYS, WAIT_SECONDS, Signals, gateway_main, locker_main
from sessionrepo.demo.report import GatewayReport, OutageReport


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of the SQLite file at ``path``."""
    return URL.create("sqlite+pysqlite", database=str(path.resolve())).render_as_string()


def _context() -> Any:
    """Fresh processes, cheaply: a fork server that imported the library once (where
    the platform has one), else plain spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["sessionrepo.demo.gateway"])
        return context
    return multiprocessing.get_context("spawn")


def run_processes(
    path: Path, url: str, outboxes: dict[str, Path], turns: int
) -> tuple[list[GatewayReport], OutageReport]:
    """Start the gateways and the locker, wait for every report (a process that dies
    without one gets a report saying so), and make sure none is left running."""
    context = _context()
    reports: Any = context.Queue()
    parties = len(GATEWAYS) + 1  # the locker takes part in every barrier
    signals = Signals(
        start=context.Barrier(parties),
        handed_over=context.Event(),
        resumed=context.Event(),
        outage_begin=context.Barrier(parties),
        locked=context.Event(),
        outage_end=context.Barrier(parties),
        released=context.Event(),
        reports=reports,
    )
    processes = {
        name: context.Process(
            target=gateway_main,
            args=(name, url, sqlite_url(outboxes[name]), turns, signals),
            name=f"gateway-{name}",
        )
        for name in GATEWAYS
    }
    processes["outage"] = context.Process(
        target=locker_main, args=(str(path.resolve()), signals), name="outage"
    )
    for process in processes.values():
        process.start()
    received: dict[str, GatewayReport | OutageReport] = {}
    deadline = time.monotonic() + 2 * WAIT_SECONDS
    try:
        while len(received) < len(processes) and time.monotonic() < deadline:
            try:
                report: GatewayReport | OutageReport = reports.get(timeout=0.5)
            except queue.Empty:
                if any(process.is_alive() for process in processes.values()):
                    continue
                try:  # all gone: take what was sent, then stop waiting
                    report = reports.get(timeout=1.0)
                except queue.Empty:
                    break
            received[report.name] = report
    finally:
        everyone = len(received) == len(processes)
        for process in processes.values():
            process.join(timeout=WAIT_SECONDS if everyone else 1.0)
            if process.is_alive():
                process.terminate()
                process.join()
        reports.close()

    def silent(name: str) -> str:
        return f"process exited with code {processes[name].exitcode} without reporting"

    gateways = []
    for name in GATEWAYS:
        got = received.get(name)
        gateways.append(
            got if isinstance(got, GatewayReport) else GatewayReport(name, error=silent(name))
        )
    outage = received.get("outage")
    if not isinstance(outage, OutageReport):
        outage = OutageReport(error=silent("outage"))
    return gateways, outage


# -- verification, with plain SQL on the files ----------------------------------------
