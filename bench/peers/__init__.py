"""sojourn against Restate, DBOS and LangGraph, and the raw NATS floor, on this machine.

Run from the repository root with the peers' virtualenv (bench/README.md, "Peers")::

    /tmp/peersvenv/bin/python -m bench.peers                 # full, ~3.5 min
    /tmp/peersvenv/bin/python -m bench.peers --quick         # ~1 min
    /tmp/peersvenv/bin/python -m bench.peers --only sojourn,restate --json peers.json

Every server and process is started by the bench on free ports in temp dirs, each in a process
group of its own, and killed (SIGKILL, the group) and removed when its column is done, on an
error or on Ctrl-C. A peer whose software is missing is reported "not installed" with the
reason; one that fails is reported "failed" and the others still run. Columns run one after
the other (sojourn and raw first, then Restate, DBOS, LangGraph); each engine has its default
settings but for what the workload needs (the "Setups" lines of the output list them).

The workload is the same everywhere: a step is a trivial function returning its input + 1
(``common.ainc``), recorded durably by the engine before the run goes on: sojourn ``ctx.step``;
Restate ``ctx.run_typed``; DBOS an async ``@DBOS.step`` in an async ``@DBOS.workflow``;
LangGraph one superstep of a one-node graph looping on itself, SQLite checkpointer,
``durability="sync"``, one thread per run.

Figures (the table shows medians over ``--repeats`` repeats, after an untimed warm-up):

- **sequential step**: one run of N trivial steps; its start -> its result (wall, in the
  process that starts it) / N. For sojourn that is foundation.py's ``wall_per_step`` (client
  start -> worker done); its event-stamped figure is in the details. Raw: 1 / rate of N
  sequential CAS appends (foundation.py's ``RawBench.sequential``; its p50 in the details).
- **concurrent steps/s**: 100 runs x 10 steps started at once; 1000 / (first start -> last
  result). sojourn: foundation.py's ``SojournBench.concurrent`` (to the last ``RunCompleted``
  stamp); raw: 100 subjects x 10 CAS appends at once (``RawBench.concurrent``).
- **1-step run p50**: K sequential 1-step runs, 5 ms apart (untimed); start -> result, p50.
  sojourn: ``SojournBench.latency`` (client and in-process worker over NATS); Restate: a
  ``POST /peers/one`` to the ingress (waits for the result); DBOS and LangGraph: start and await
  in the process that runs the workflow/graph (they are libraries); raw: foundation.py's inbox
  floor (trigger through an inbox stream, two CAS appends).
- **kills** (``common.kill_round``): a run of steps that sleep (early: 3 x 0.2 s; mid: 2 x 1 s)
  whose code sends a UDP *mark* to the bench when the run's function is entered in a process
  and when a step's body starts. The process executing the run (known from the mark's pid) is
  SIGKILLed 0-20 ms (uniform) after the ``enter`` mark (early) or 0.5 s after the first step's
  mark (mid). Figure: kill -> the first step mark of that run from another process, i.e. the
  interrupted step starting to execute again under the engine's recovery; the details add kill
  -> the run's result. Recovery per engine: sojourn, a standby worker process already up (as
  bench/takeover.py's standby mode); Restate, a standby service process accepting on the same
  listening socket as the killed one (the deployment's URI), restate-server retrying the
  invocation under its default retry policy; DBOS, the process relaunched right after the kill
  (a new interpreter: DBOS recovers its executor's pending workflows at launch; the details
  show how much of it is interpreter start and imports); LangGraph, which has no recovery of
  its own: a standby process told to re-invoke the thread the moment the bench has killed the
  first, so its figure is resume -> step inside an already warm process, a lower bound of what
  a user's supervisor could do, not an engine's detection and retry.
"""
