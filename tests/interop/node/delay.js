// Timer (DELAY) messages and recall with the official RocketMQ 5 Node.js Producer.
//   node delay.js ENDPOINTS < spec.json
// spec.json and the printed JSON list as tests/interop/python/delay.py's (the
// Node.js client sends delivery times in milliseconds).
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

function error(e) {
  return String(e && e.message ? e.message : e);
}

async function main() {
  const spec = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const topic = spec.topic;
  const producer = new Producer({ endpoints: process.argv[2], topics: [topic], requestTimeout: 5000 });
  await producer.startup();
  const out = [];
  try {
    for (const m of spec.messages) {
      const due = Date.now() + m.delay_s * 1000;
      try {
        const receipt = await producer.send({
          topic, body: Buffer.from(m.body), deliveryTimestamp: new Date(due),
        });
        out.push({
          message_id: receipt.messageId, recall_handle: receipt.recallHandle,
          deliver_at_ms: due, recalled: null, recall_again: null,
        });
      } catch (e) {
        out.push({ error: error(e) });
      }
    }
    for (const i of spec.recall || []) {
      const entry = out[i];
      entry.recalled = (await producer.recallMessage(topic, entry.recall_handle)).messageId;
      try {
        await producer.recallMessage(topic, entry.recall_handle);
      } catch (e) {
        entry.recall_again = error(e);
      }
    }
  } finally {
    await producer.shutdown();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
