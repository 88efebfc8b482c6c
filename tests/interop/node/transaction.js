// Transactional messages with the official RocketMQ 5 Node.js Producer.
//   node transaction.js ENDPOINTS < spec.json
// spec.json and the printed JSON lines as tests/interop/python/transaction.py's.
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function say(line) {
  process.stdout.write(JSON.stringify(line) + '\n');
}

async function main() {
  const spec = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const topic = spec.topic;
  const answer = spec.checker === 'rollback' ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
  const checked = new Set();
  const checker = {
    async check(view) {
      const body = view.body.toString();
      checked.add(body);
      say({ checked: body, message_id: view.messageId, topic: view.topic });
      return answer;
    },
  };
  const producer = new Producer({ endpoints: process.argv[2], topics: [topic], requestTimeout: 5000, checker });
  await producer.startup();
  try {
    for (const m of spec.messages || []) {
      const transaction = producer.beginTransaction();
      const receipt = await producer.send({ topic, body: Buffer.from(m.body) }, transaction);
      say({ half: m.body, message_id: receipt.messageId, transaction_id: receipt.transactionId });
      if (m.end === 'hang') {
        await new Promise(resolve => setTimeout(resolve, 3600 * 1000));
      }
      let err = null;
      try {
        await (m.end === 'commit' ? transaction.commit() : transaction.rollback());
      } catch (e) {
        err = String(e && e.message ? e.message : e);
      }
      say({ ended: m.body, error: err });
    }
    const deadline = Date.now() + (spec.wait_s || 60) * 1000;
    const wanted = spec.check_until || [];
    while (!wanted.every(b => checked.has(b)) && Date.now() < deadline) {
      await new Promise(resolve => setTimeout(resolve, 200));
    }
    // the checker's EndTransaction goes out after check() returns
    await new Promise(resolve => setTimeout(resolve, 1000));
  } finally {
    await producer.shutdown();
  }
  say({ done: true });
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
