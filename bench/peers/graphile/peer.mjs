// graphile-worker as the peer of bench/peer_graphile.py (see that module's docstring).
//
//   node peer.mjs worker --dsn URL --profile default|tuned [--options JSON]
//       (--options: worker settings over the profile's, for trying other tunings)
//       Runs one worker (one `run()`), prints READY once it is running, then one line per
//       job it starts: key<TAB>due epoch ms<TAB>started epoch ms (the handler's first act).
//   node peer.mjs add --dsn URL --file jobs.json [--warmup B] [--gate]
//       Adds the jobs of the file with `addJobs` and prints one JSON line of statistics.
//       The file: {"bundle": 500, "jobKey": false, "jobs": [[key, dueMs, sendAtMs|null], ...]}.
//       Jobs without a sendAt go in bundles of `bundle`; a job with one is added alone at
//       that instant (the idle scenario). Each job's runAt is its dueMs. First B untimed
//       bundles of far-future jobs (connections warm). With --gate it prints READY and waits
//       for SIGUSR1 before it reads the file: the bench writes it, then measures from there.
//   node peer.mjs clear --dsn URL
//       Deletes every job (the calibration's far-future ones).
import { performance } from "node:perf_hooks";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Logger, makeWorkerUtils, run } from "graphile-worker";

const TASK = "fire";

// What "tuned" means: the knobs graphile-worker's performance guide names, set for a
// single worker that must both start due jobs soon and drain a backlog fast.
export const PROFILES = {
  // graphile-worker as installed: concurrency 1, pollInterval 2000 ms, pool of 10, no local
  // queue, each completion its own statement.
  default: {},
  tuned: {
    concurrentJobs: 16, // jobs in flight, so a completion's commit never stalls the next start
    pollInterval: 10, // a future runAt is only seen by a poll (NOTIFY fires at insert time)
    maxPoolSize: 18, // concurrentJobs + 2, as its docs advise
    localQueue: { size: 500 }, // fetch (and lock) up to 500 due jobs per statement
    completeJobBatchDelay: 0, // completions of one tick in one statement
  },
};

// Warnings and errors only: its per-job info lines would cost the worker CPU.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") process.stderr.write(`${level}: ${message}\n`);
});

function nowMs() {
  return performance.timeOrigin + performance.now();
}

async function worker(dsn, profile, extra) {
  if (!PROFILES[profile]) throw new Error(`unknown profile ${profile}`);
  const options = { ...PROFILES[profile], ...JSON.parse(extra ?? "{}") };
  const out = process.stdout;
  const runner = await run({
    noHandleSignals: true,
    logger,
    taskList: {
      [TASK]: async (payload) => {
        const started = nowMs();
        out.write(`${payload.k}\t${payload.d}\t${started.toFixed(3)}\n`);
      },
    },
    preset: { worker: { connectionString: dsn, ...options } },
  });
  const stop = async () => {
    await runner.stop();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  out.write("READY\n");
  await runner.promise;
}

async function add(dsn, file, warmup, gate) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger });
  await utils.migrate();
  const far = Date.now() + 3_600_000;
  for (let b = 0; b < warmup; b++) {
    await utils.addJobs(Array.from({ length: 500 }, (_, i) => ({
      identifier: TASK, payload: { k: `warm-${b}-${i}`, d: far }, runAt: new Date(far) })));
  }
  if (gate) {
    const go = new Promise((resolve) => process.once("SIGUSR1", resolve));
    process.stdout.write("READY\n");
    await go;
  }
  const spec = JSON.parse(readFileSync(file, "utf8"));
  const bundle = spec.bundle ?? 500;
  const cpu0 = process.cpuUsage();
  const t0 = nowMs();
  const jobs = spec.jobs;
  const latencies = [];
  const toSpec = ([k, d]) => ({
    identifier: TASK,
    payload: { k, d },
    runAt: new Date(d),
    ...(spec.jobKey ? { jobKey: k } : {}),
  });
  let i = 0;
  while (i < jobs.length) {
    let group;
    if (jobs[i][2] != null) {
      const wait = jobs[i][2] - nowMs();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      group = [jobs[i]];
    } else {
      let j = i;
      while (j < jobs.length && j - i < bundle && jobs[j][2] == null) j++;
      group = jobs.slice(i, j);
    }
    const sent = nowMs();
    const added = await utils.addJobs(group.map(toSpec));
    latencies.push(nowMs() - sent);
    if (added.length !== group.length) {
      throw new Error(`addJobs returned ${added.length} jobs for ${group.length}`);
    }
    i += group.length;
  }
  const elapsed = nowMs() - t0;
  const cpu = process.cpuUsage(cpu0);
  await utils.release();
  process.stdout.write(JSON.stringify({
    jobs: jobs.length, elapsed_ms: elapsed, calls: latencies.length, call_ms: latencies,
    cpu_ms: (cpu.user + cpu.system) / 1000,
  }) + "\n");
}

async function clear(dsn) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger });
  await utils.migrate();
  await utils.withPgClient((client) => client.query("DELETE FROM graphile_worker._private_jobs"));
  await utils.release();
  process.stdout.write("{}\n");
}

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: { dsn: { type: "string" }, profile: { type: "string", default: "default" },
             options: { type: "string" },
             file: { type: "string" }, warmup: { type: "string", default: "0" },
             gate: { type: "boolean", default: false } },
});
const command = positionals[0];
if (command === "worker") await worker(values.dsn, values.profile, values.options);
else if (command === "add") {
  await add(values.dsn, values.file, Number(values.warmup), values.gate);
}
else if (command === "clear") await clear(values.dsn);
else if (command === "profiles") process.stdout.write(JSON.stringify(PROFILES) + "\n");
else {
  process.stderr.write("usage: node peer.mjs worker|add|clear|profiles --dsn URL ...\n");
  process.exit(2);
}
