// Load from the official RocketMQ 5 Node.js client (rocketmq-client-nodejs
// 1.0.8) for benchmarks/rocketmq_v2.py.
//   node node_v2.js produce|consume ENDPOINTS < spec
// The spec, the ready / go handshake and the result line are
// benchmarks/interop/python_v2.py's. The client is async: `concurrency`
// loops each await one Producer.send (1 KiB) after another for duration_s;
// or `concurrency` loops each SimpleConsumer.receive(batch) then ack every
// message (one AckMessage each, in parallel) until `expect` are acked or
// nothing came for 3 s. The package is tests/interop/node's (NODE_PATH).
'use strict';
const readline = require('readline');
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const INVISIBLE_MS = 30000;
// A receive loop stops once nothing was acked for this long.
const IDLE_S = 3;

async function main() {
  const [mode, endpoints] = process.argv.slice(2);
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const spec = JSON.parse((await lines.next()).value);
  const go = async warmed => {
    process.stdout.write(JSON.stringify({ ready: true, warmed }) + '\n');
    const line = (await lines.next()).value;
    if (line.trim() !== 'go') throw new Error(`expected go, got ${line}`);
  };
  const done = { count: 0, errors: 0, last: 0 };
  let started, cpu;
  const now = () => Number(process.hrtime.bigint()) / 1e9;
  const cpuS = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
  if (mode === 'produce') {
    const producer = new Producer({ endpoints, topics: [spec.topic], requestTimeout: 10000 });
    await producer.startup();
    const body = Buffer.alloc(spec.body_size);
    const message = () => ({ topic: spec.topic, tag: 'TagA', body });
    await producer.send(message());
    await go(1);
    started = now(); cpu = cpuS();
    const stop = started + spec.duration_s;
    const loop = async () => {
      while (now() < stop) {
        try { await producer.send(message()); done.count++; } catch (e) { done.errors++; }
        done.last = now();
      }
    };
    await Promise.all(Array.from({ length: spec.concurrency }, loop));
    cpu = cpuS() - cpu;
    // 1.0.8's shutdown may log to a closed stream and throw: the figures are in.
    await producer.shutdown().catch(() => {});
  } else {
    const consumer = new SimpleConsumer({
      endpoints, consumerGroup: spec.group, requestTimeout: 10000,
      awaitDuration: 1000, subscriptions: new Map([[spec.topic, '*']]),
    });
    await consumer.startup();
    await go(0);
    started = now(); cpu = cpuS();
    const loop = async () => {
      while (done.count < spec.expect) {
        const messages = await consumer.receive(spec.batch, INVISIBLE_MS);
        if (!messages.length && now() - Math.max(done.last, started) > IDLE_S) break;
        await Promise.all(messages.map(async m => {
          try { await consumer.ack(m); done.count++; } catch (e) { done.errors++; }
          done.last = now();
        }));
      }
    };
    await Promise.all(Array.from({ length: spec.concurrency }, loop));
    cpu = cpuS() - cpu;
    // 1.0.8's shutdown may log to a closed stream and throw: the figures are in.
    await consumer.shutdown().catch(() => {});
  }
  process.stdout.write(JSON.stringify({
    count: done.count, errors: done.errors, secs: done.last - started, cpu_s: cpu,
  }) + '\n');
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
