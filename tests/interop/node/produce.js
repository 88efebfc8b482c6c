// Send messages with the official RocketMQ 5 Node.js Producer.
//   node produce.js ENDPOINTS [tls] < messages.json
// messages.json as tests/interop/python/produce.py's (credentials included);
// prints the same JSON list.
// tls: sslEnabled (the CA trusted through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

async function main() {
  const endpoints = process.argv[2];
  const spec = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const sslEnabled = process.argv[3] === 'tls';
  const options = { endpoints, topics: [spec.topic], requestTimeout: 5000, sslEnabled };
  if (spec.credentials) {
    options.sessionCredentials = {
      accessKey: spec.credentials.accessKey,
      accessSecret: spec.credentials.secretKey,
    };
  }
  const producer = new Producer(options);
  try {
    await producer.startup();
  } catch (e) {
    const error = { error: String(e && e.message ? e.message : e) };
    process.stdout.write(JSON.stringify(spec.messages.map(() => error)) + '\n');
    process.exit(0);
  }
  const out = [];
  try {
    for (const m of spec.messages) {
      try {
        const receipt = await producer.send({
          topic: spec.topic,
          tag: m.tag,
          keys: m.keys || [],
          messageGroup: m.group,
          properties: new Map(Object.entries(m.properties || {})),
          body: Buffer.from(m.body),
        });
        out.push({ message_id: receipt.messageId });
      } catch (e) {
        out.push({ error: String(e && e.message ? e.message : e) });
      }
    }
  } finally {
    await producer.shutdown();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}

main().catch(e => { console.error(e); process.exit(1); });
