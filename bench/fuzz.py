"""``python -m bench.fuzz``: the long fuzz run of what a hostile sender can write.

The same two targets as the CI tests, with a larger budget and a seed of your choosing:

- **the gate and the codec** (tests/schemas/test_guard.py): every codec decoder and
  ``check_json`` on generated hostile bodies: a value or a refusal, never another exception;
- **the intake** (tests/actors/worker/test_fuzz_intake.py): generated bodies and headers on every
  inbox subject, against a real worker on an embedded nats-server; each message answered within
  5 s, none delivered twice, the worker serving a good start at the end.

It prints how many examples each target ran, the refusals by reason and the time taken, and
exits non-zero on the first failure (Hypothesis prints the falsifying example)::

    python -m bench.fuzz --examples 5000 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.guard import BodyRefused, check_json
from tests.fuzzing import KINDS, FuzzTarget
from tests.hostile import hostile_bodies, hostile_headers
from tests.schemas.test_guard import DECODERS


def budget(examples: int, at: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hypothesis settings of a long run: ``examples`` examples from seed ``at``, no deadline,
    no example database, no health check (the generators are slow on purpose)."""

    def apply(test: Callable[..., None]) -> Callable[..., None]:
        limits = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        return seed(at)(limits(test))

    return apply


def fuzz_codec(examples: int, at: int) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()

    @budget(examples, at)
    @given(hostile_bodies)
    def one(body: bytes) -> None:
        try:
            check_json(body, envelope=1)
            seen["accepted"] += 1
        except BodyRefused as e:
            seen[e.code] += 1
        for decode in DECODERS:
            try:
                decode(body)
            except msgspec.MsgspecError:
                pass

    one()
    return seen


def fuzz_intake(examples: int, at: int) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(store_dir=Path(tmp), port=0)
        loop = asyncio.new_event_loop()  # the server's process belongs to the loop it began on
        loop.run_until_complete(server.start())
        try:
            deployment = Settings(prefix=f"fz{uuid.uuid4().hex[:8]}")
            with FuzzTarget(server.url, deployment) as target:

                @budget(examples, at)
                @given(st.sampled_from(KINDS), hostile_bodies, hostile_headers)
                def one(kind: str, body: bytes, headers: dict[str, str]) -> None:
                    answer = target.send(kind, body, headers)
                    error = answer.get("error")
                    seen[error["code"] if error else "accepted"] += 1

                one()
                target.check_settled()
                assert target.good_start_works(), "the worker stopped serving"
        finally:
            loop.run_until_complete(server.stop())
            loop.close()
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    parser.add_argument("--examples", type=int, default=2000, help="per target (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    parser.add_argument(
        "--only", choices=["codec", "intake"], help="run one target (default: both)"
    )
    args = parser.parse_args(argv)
    for name, run in (("codec", fuzz_codec), ("intake", fuzz_intake)):
        if args.only and args.only != name:
            continue
        t0 = time.perf_counter()
        seen = run(args.examples, args.seed)
        took = time.perf_counter() - t0
        total = sum(seen.values())
        reasons = ", ".join(f"{k} {v}" for k, v in seen.most_common())
        print(f"{name}: {total} examples in {took:.1f} s, no failure ({reasons})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
