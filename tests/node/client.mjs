// A sojourn client in Node.js, written against docs/wire.md and the NATS JavaScript libraries
// only (no sojourn code): the proof that the wire contract is enough for any language.
//
//   node client.mjs --server URL --prefix PREFIX --agent AGENT --run-id ID --input JSON
//                   [--signal NAME] [--timeout SECONDS]
//
// It starts the run (JetStream publish on <prefix>.start.<agent>.<run_id>), checks the intake's
// answer, watches the run's view in the KV bucket <PREFIX>_RUNS until it is `completed` (sending
// the signal NAME once the view says the run waits for it), tails the run's output stream live,
// then reads the whole output, resumes from an offset in the middle and checks it gets exactly
// the chunks after it, and that the text of the chunks is the run's output (the last decision
// of <prefix>.ev.<run_id>). It prints what it sees and exits 0, or 1 with the reason.
// tests/test_node_client.py runs it against a real server, worker and projector.

import { parseArgs } from "node:util";

import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, createInbox, headers } from "@nats-io/transport-node";

const TOKEN = /^[A-Za-z0-9_-]{1,128}$/; // agent names, run ids, signal name parts (docs/wire.md)
const PREFIX = /^[a-z][a-z0-9_]{0,31}$/;
const ENDED = new Set(["completed", "failed", "cancelled"]);
// The statuses a run may move between (schemas/views.py RunView.status). A view can skip
// states (the projector writes one view per batch of decisions), never go back to `pending`.
const NEXT = {
  pending: ["running", "waiting", "completed", "failed", "cancelled", "suspended"],
  running: ["waiting", "completed", "failed", "cancelled", "suspended"],
  waiting: ["running", "completed", "failed", "cancelled", "suspended"],
  suspended: ["running", "waiting", "completed", "failed", "cancelled"],
};

class Failure extends Error {}

function check(condition, message) {
  if (!condition) throw new Failure(message);
}

function say(...parts) {
  console.log(...parts);
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Failure(`${what} is not JSON: ${err.message}`);
  }
}

function options() {
  const { values } = parseArgs({
    options: {
      server: { type: "string" },
      prefix: { type: "string" },
      agent: { type: "string" },
      "run-id": { type: "string" },
      input: { type: "string" },
      signal: { type: "string" },
      timeout: { type: "string", default: "120" },
    },
    strict: true,
  });
  for (const name of ["server", "prefix", "agent", "run-id", "input"]) {
    check(values[name] !== undefined, `missing --${name}`);
  }
  check(PREFIX.test(values.prefix), `invalid --prefix ${JSON.stringify(values.prefix)}`);
  check(TOKEN.test(values.agent), `invalid --agent ${JSON.stringify(values.agent)}`);
  check(TOKEN.test(values["run-id"]), `invalid --run-id ${JSON.stringify(values["run-id"])}`);
  if (values.signal !== undefined) {
    check(values.signal.split(".").every((p) => TOKEN.test(p)), "invalid --signal");
  }
  const timeout = Number(values.timeout);
  check(Number.isFinite(timeout) && timeout > 0, "invalid --timeout");
  return {
    server: values.server,
    prefix: values.prefix,
    agent: values.agent,
    runId: values["run-id"],
    input: parseJson(values.input, "--input"),
    signal: values.signal,
    timeoutMs: timeout * 1000,
  };
}

/** Resolve `promise`, or fail after `ms` milliseconds (calling `onTimeout`) saying `what`: a
 * string, or a function giving one (to tell what had been seen by then). */
async function within(ms, what, promise, onTimeout = () => {}) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => {
      onTimeout();
      const said = typeof what === "function" ? what() : what;
      reject(new Failure(`timed out after ${ms / 1000}s ${said}`));
    }, ms);
  });
  try {
    return await Promise.race([promise, expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** Decode one output message as a `Chunk` (schemas/views.py), checking what this test relies on. */
function chunkOf(m, runId) {
  let c;
  try {
    c = m.json();
  } catch (err) {
    throw new Failure(`output seq ${m.seq}: not JSON (${err.message})`);
  }
  check(c !== null && typeof c === "object", `output seq ${m.seq}: not a JSON object`);
  check(c.run_id === runId, `output seq ${m.seq}: run_id ${JSON.stringify(c.run_id)}`);
  for (const field of ["position", "attempt", "execution", "index"]) {
    check(Number.isInteger(c[field]), `output seq ${m.seq}: ${field} is not an integer`);
  }
  const kind = c.kind ?? "text";
  check(kind === "text" || kind === "progress", `output seq ${m.seq}: kind ${kind}`);
  return { seq: m.seq, kind, text: c.text ?? "", position: c.position, execution: c.execution,
           index: c.index };
}

/** Decode a KV entry as a `RunView` (schemas/views.py): open-world, so only what this client
 * uses is checked, and fields a newer projector adds are ignored. */
function viewOf(e) {
  let v;
  try {
    v = e.json();
  } catch (err) {
    throw new Failure(`view revision ${e.revision}: not JSON (${err.message})`);
  }
  check(v !== null && typeof v === "object", `view revision ${e.revision}: not an object`);
  check(typeof v.status === "string", `view revision ${e.revision}: no status`);
  check(Number.isInteger(v.last_seq ?? 0), `view revision ${e.revision}: last_seq`);
  const waiting = v.waiting_on ?? [];
  check(Array.isArray(waiting), `view revision ${e.revision}: waiting_on is not a list`);
  return { ...v, last_seq: v.last_seq ?? 0, waiting_on: waiting, ended_at: v.ended_at ?? null,
           error: v.error ?? null };
}

/**
 * Read the run's output from `after` + 1 (an offset is a stream sequence; 0: from the start)
 * with an ordered consumer filtered on the run's subject, until nothing is pending.
 */
async function readOutput(js, o, after, timeoutMs) {
  const consumer = await js.consumers.get(`${o.prefix.toUpperCase()}_OUTPUT`, {
    filter_subjects: [`${o.prefix}.out.${o.runId}`],
    opt_start_seq: after + 1,
  });
  const messages = await consumer.consume();
  const got = [];
  const read = (async () => {
    for await (const m of messages) {
      got.push(chunkOf(m, o.runId));
      if (m.info.pending === 0) break;
    }
  })();
  const what = () => `reading the output after offset ${after} (got ${got.length})`;
  await within(timeoutMs, what, read, () => messages.stop());
  return got;
}

/** The run's text: text chunks in order, keeping only each step's latest execution (a step
 * executed again after a crash writes its chunks again under a new `execution`). */
function textOf(chunks) {
  const latest = new Map();
  for (const c of chunks) {
    latest.set(c.position, Math.max(latest.get(c.position) ?? -1, c.execution));
  }
  return chunks
    .filter((c) => c.kind === "text" && c.execution === latest.get(c.position))
    .map((c) => c.text)
    .join("");
}

function sameChunks(a, b) {
  return a.length === b.length && a.every((c, i) => JSON.stringify(c) === JSON.stringify(b[i]));
}

async function main() {
  const o = options();
  const upper = o.prefix.toUpperCase();
  const nc = await connect({ servers: o.server, name: `node-client ${o.runId}` });
  try {
    const js = jetstream(nc);
    const jsm = await jetstreamManager(nc);

    // 1. Before starting: watch the run's key (every view written from now on) and tail its
    //    output stream, so nothing the run does falls before the readers start.
    const kv = await new Kvm(js).open(`${upper}_RUNS`);
    const views = await kv.watch({ key: o.runId });
    const live = [];
    let liveWanted = Infinity;
    let liveReached;
    const reached = new Promise((resolve) => (liveReached = resolve));
    const tail = await (await js.consumers.get(`${upper}_OUTPUT`, {
      filter_subjects: [`${o.prefix}.out.${o.runId}`],
    })).consume();
    const tailing = (async () => {
      for await (const m of tail) {
        live.push(chunkOf(m, o.runId));
        if (live.length >= liveWanted) liveReached();
      }
      throw new Failure("the live tail ended early");
    })();
    tailing.catch(() => {}); // raced against below; a failure before then is not unhandled

    // 2. Start: a JetStream publish (the PubAck is the durable receipt), the answer on an inbox
    //    named in Sojourn-Reply-To, the run id in the subject and Nats-Msg-Id for retries.
    const replyTo = createInbox();
    const answers = nc.subscribe(replyTo, { max: 1 });
    const h = headers();
    h.set("Sojourn-Reply-To", replyTo);
    const body = JSON.stringify({ input: o.input }); // the subject names the run
    const ack = await js.publish(`${o.prefix}.start.${o.agent}.${o.runId}`, body, {
      msgID: `start:${o.agent}:${o.runId}`,
      headers: h,
    });
    check(ack.stream === `${upper}_INBOX`, `PubAck from stream ${ack.stream}`);
    check(!ack.duplicate, "the start was a duplicate: is the run id fresh?");
    say(`start stored: ${ack.stream} seq ${ack.seq}`);
    const answer = await within(o.timeoutMs, "waiting for the intake's answer", (async () => {
      for await (const m of answers) return m.json();
      throw new Failure("the answer subscription closed");
    })());
    check(answer.error === undefined,
          `start refused: ${answer.error?.code}: ${answer.error?.message}`);
    check(answer.run_id === o.runId && answer.created === true,
          `unexpected answer ${JSON.stringify(answer)}`);
    say(`answer: ${JSON.stringify(answer)}`);

    // 3. Watch the view until the run ends; answer the signal it waits for.
    const statuses = [];
    let final = null;
    let lastSeq = 0;
    let signalled = false;
    const watching = (async () => {
      for await (const e of views) {
        if (e.operation !== "PUT") continue;
        const view = viewOf(e);
        check(view.run_id === o.runId && view.agent === o.agent,
              `view of ${view.agent}/${view.run_id}`);
        check(view.last_seq >= lastSeq, `view went back from seq ${lastSeq} to ${view.last_seq}`);
        lastSeq = view.last_seq;
        const previous = statuses.at(-1);
        if (view.status !== previous) {
          check(previous === undefined || (NEXT[previous] ?? []).includes(view.status),
                `status ${previous} -> ${view.status} (seen: ${statuses.join(", ")})`);
          statuses.push(view.status);
          say(`view: ${view.status} (revision ${e.revision}, last_seq ${view.last_seq}` +
              `${view.waiting_on.length ? `, waiting on ${view.waiting_on.join(" ")}` : ""})`);
        }
        const wanted = `signal:${o.signal}`;
        if (o.signal && !signalled && view.status === "waiting" &&
            view.waiting_on.includes(wanted)) {
          const sig = await js.publish(`${o.prefix}.signal.${o.runId}.${o.signal}`,
                                       JSON.stringify(true),
                                       { msgID: `signal:${o.runId}:${o.signal}` });
          signalled = true;
          say(`signal ${o.signal} stored: seq ${sig.seq}`);
        }
        if (ENDED.has(view.status)) {
          final = view;
          return;
        }
      }
    })();
    await within(o.timeoutMs, () => `watching the view (seen: ${statuses.join(", ")})`, watching,
                 () => views.stop());
    views.stop();
    check(final.status === "completed",
          `run ended ${final.status}: ${JSON.stringify(final.error)}`);
    if (o.signal) check(signalled, `the view never showed the run waiting on ${o.signal}`);
    check(final.ended_at !== null && final.error === null,
          `completed view ${JSON.stringify(final)}`);

    // 4. The run's output: the last decision of its history is [..., run.completed.v1].
    const last = await jsm.direct.getMessage(`${upper}_EVENTS`, {
      last_by_subj: `${o.prefix}.ev.${o.runId}`,
    });
    check(last !== null, "the run has no history");
    const events = last.json();
    check(Array.isArray(events) && events.length > 0, "the last decision is not an event array");
    const end = events.at(-1);
    check(end.type === "run.completed.v1", `the last event is ${end.type}`);
    say(`output: ${JSON.stringify(end.output)}`);
    check(typeof end.output === "string", "this test needs an agent whose output is its text");

    // 5. The whole output stream, then a resume from an offset in the middle.
    const full = await readOutput(js, o, 0, o.timeoutMs);
    say(`output stream: ${full.length} chunks, seqs ${full.map((c) => c.seq).join(" ")}`);
    check(full.length >= 3, "too few chunks to resume in the middle");
    const text = textOf(full);
    check(text === end.output,
          `chunks say ${JSON.stringify(text)}, the run returned ${JSON.stringify(end.output)}`);
    const middle = Math.floor(full.length / 2) - 1;
    const offset = full[middle].seq;
    const rest = await readOutput(js, o, offset, o.timeoutMs);
    check(sameChunks(rest, full.slice(middle + 1)),
          `resumed after ${offset}: seqs ${rest.map((c) => c.seq).join(" ")}, expected ` +
          `${full.slice(middle + 1).map((c) => c.seq).join(" ")}`);
    say(`resumed after offset ${offset}: ${rest.length} chunks, as expected`);

    // 6. The live tail saw the same chunks as they were written.
    liveWanted = full.length;
    if (live.length >= liveWanted) liveReached();
    await within(o.timeoutMs, () => `tailing the output (got ${live.length} of ${full.length})`,
                 Promise.race([reached, tailing]));
    tail.stop();
    check(sameChunks(live, full), "the live tail differs from the stored output");
    say(`live tail: the same ${live.length} chunks`);
    say(`ok: statuses ${statuses.join(" -> ")}`);
  } finally {
    await nc.close();
  }
}

try {
  await main();
} catch (err) {
  console.error(err instanceof Failure ? `FAIL: ${err.message}` : err);
  process.exitCode = 1;
}
