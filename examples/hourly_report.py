"""An agent that runs on the clock: every hour, a report on the hour that just ended.

``report`` takes ``{"team": str, "to": str}`` (both optional) and runs two steps:
``collect_numbers`` fetches the numbers of one hour (here fake, derived from the team and the
hour, so the same hour always gives the same numbers) and ``send_report`` mails them (here it
prints the report; a real one hands ``current_step().idempotency_key`` to the mail API). The
hour comes from ``ctx.scheduled_at``, the fire time that started the run: nominal, so a fire
handled late (after an outage, under jitter) still reports on its own hour, and a replay sees
the same time. A run started by hand (``sojourn start report --input '{}'``) has no fire time
and reports on the last full hour before its start (``ctx.now()``, journaled).

Run it::

    sojourn dev --app examples.hourly_report
    sojourn schedule add hourly-report --agent report --cron '0 * * * *' \\
        --timezone Europe/Berlin --input '{"team": "sales"}'
    sojourn schedule trigger hourly-report    # one run now, without waiting for the hour
    sojourn schedule list                     # next fire, last run and its status

From Python, with a worker serving ``report`` up (``add_schedule`` waits for its answer)::

    async with await Client.connect() as client:
        record = await client.add_schedule(
            "hourly-report",
            agent="report",
            cron="0 * * * *",
            timezone="Europe/Berlin",
            input={"team": "sales", "to": "sales-leads@example.com"},
        )
        print(record.next_fire_at)

Each fire starts one run, named after the fire time (``hourly-report-at20261202T090000Z`` for
10:00 in Berlin): however often the fire is delivered, and by however many workers, the hour is
reported once. (On the night the clocks go back, Berlin's 02:00 comes twice and fires once, so
one hour a year goes unreported: where every hour counts, use ``--every 1h``, the same hours.)
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import msgspec

from sojourn.actors import Context, agent, current_step


class ReportRequest(msgspec.Struct, frozen=True, kw_only=True):
    team: str = "sales"
    to: str = "team@example.com"


class HourlyNumbers(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    start: datetime
    """The hour's first instant (UTC)."""
    orders: int
    revenue_cents: int
    refunds: int


class Report(msgspec.Struct, frozen=True, kw_only=True):
    hour: datetime
    """The hour reported on: its first instant (UTC)."""
    scheduled: bool
    """Started by a schedule's fire (``False``: started by hand)."""
    orders: int
    revenue_cents: int
    message_id: str


def collect_numbers(team: str, start: datetime) -> HourlyNumbers:
    """The numbers of ``team`` for the hour from ``start``: call your CRM or warehouse here.

    This one is fake and deterministic (a digest of the team and the hour), so the example
    needs nothing outside sojourn and the same hour always gives the same numbers."""
    digest = hashlib.sha256(f"{team}@{start.isoformat()}".encode()).digest()
    orders = digest[0] % 40
    return HourlyNumbers(
        team=team,
        start=start,
        orders=orders,
        revenue_cents=orders * (1_000 + int.from_bytes(digest[1:3], "big") % 9_000),
        refunds=digest[3] % 3,
    )


def render(numbers: HourlyNumbers) -> str:
    """The report's text (plain code between steps: it runs again on every replay)."""
    end = numbers.start + timedelta(hours=1)
    return (
        f"{numbers.team}, {numbers.start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC: "
        f"{numbers.orders} orders, {numbers.revenue_cents / 100:.2f} EUR, "
        f"{numbers.refunds} refunds"
    )


def send_report(to: str, text: str) -> str:
    """Send the report: call your mail API here, with the step's idempotency key (the same on
    every retry of this step of this run), so a step run again after a crash mails once."""
    key = current_step().idempotency_key
    print(f"to {to}: {text}", flush=True)
    return f"report-{key}"


@agent("report", version="2026-12-02")
async def report(ctx: Context, req: ReportRequest) -> Report:
    """Report on the full hour before the fire time that started this run."""
    at = ctx.scheduled_at or ctx.now()  # both UTC; the fire time is nominal, so it never drifts
    start = at.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    numbers = await ctx.step(collect_numbers, req.team, start)
    message_id = await ctx.step(send_report, req.to, render(numbers))
    return Report(
        hour=start,
        scheduled=ctx.schedule is not None,
        orders=numbers.orders,
        revenue_cents=numbers.revenue_cents,
        message_id=message_id,
    )
