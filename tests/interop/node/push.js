// A PushConsumer with the official RocketMQ 5 Node.js client.
//   node push.js ENDPOINTS < spec.json
// spec.json and the printed JSON list as tests/interop/python/push.py's.
'use strict';
const { PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');

async function main() {
  const spec = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const calls = [];
  let taken = 0;
  const consumer = new PushConsumer({
    endpoints: process.argv[2], consumerGroup: spec.group, requestTimeout: 5000,
    subscriptions: new Map([[spec.topic, '*']]),
    messageListener: {
      consume(m) {
        const body = m.body.toString();
        calls.push({ id: m.messageId, body, attempt: m.deliveryAttempt, group: m.messageGroup ?? null });
        if (spec.fail_prefix && body.startsWith(spec.fail_prefix)) return ConsumeResult.FAILURE;
        taken += 1;
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  const deadline = Date.now() + 40000;
  while (taken < spec.succeed && Date.now() < deadline) {
    await new Promise(r => setTimeout(r, 100));
  }
  await new Promise(r => setTimeout(r, Math.max(0, Math.min(spec.settle_s * 1000, deadline - Date.now()))));
  await consumer.shutdown();
  process.stdout.write(JSON.stringify(calls) + '\n');
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
