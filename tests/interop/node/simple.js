// A SimpleConsumer scenario with the official RocketMQ 5 Node.js client.
//   node simple.js ENDPOINTS < spec.json
// spec.json and the printed JSON object as tests/interop/python/simple.py's.
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');

function view(m) {
  return {
    id: m.messageId, body: m.body.toString(), attempt: m.deliveryAttempt,
    tag: m.tag, keys: [...m.keys].sort(), properties: Object.fromEntries(m.properties),
    group: m.messageGroup,
  };
}

async function receive(consumer, want, invisibleS) {
  const got = [];
  const deadline = Date.now() + 25000;
  while (got.length < want && Date.now() < deadline) {
    got.push(...await consumer.receive(16, invisibleS * 1000));
  }
  return got;
}

async function refused(consumer, message) {
  try {
    await consumer.ack(message);
  } catch (e) {
    return String(e && e.message ? e.message : e);
  }
  return null;
}

async function main() {
  const spec = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const consumer = new SimpleConsumer({
    endpoints: process.argv[2], consumerGroup: spec.group, requestTimeout: 5000,
    awaitDuration: 2000, subscriptions: new Map([[spec.topic, '*']]),
  });
  await consumer.startup();
  const out = {};
  try {
    const first = await receive(consumer, spec.expect, spec.invisible_s);
    out.first = first.map(view);
    const m0 = first[0];
    const old = m0.receiptHandle;
    await consumer.changeInvisibleDuration(m0, 1000);
    const fresh = m0.receiptHandle;
    m0.receiptHandle = old;
    out.stale_ack = await refused(consumer, m0);
    m0.receiptHandle = fresh;
    // the second held-back message comes back after 1 s too, not after the
    // receive's (long) invisible time
    await consumer.changeInvisibleDuration(first[1], 1000);
    for (const m of first.slice(2)) await consumer.ack(m);
    const again = await receive(consumer, 2, spec.invisible_s);
    for (const m of again) await consumer.ack(m);
    out.again = again.map(view);
    out.double_ack = await refused(consumer, again[0]);
  } finally {
    await consumer.shutdown();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
