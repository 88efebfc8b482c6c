// A Basalt producer and consumer in Node.js from the basalt.v1 .proto files
// alone (@grpc/proto-loader at run time; no generated code, no Basalt code):
// the client issue 19's Node.js developer should have been able to write.
//
//   node client.js PROTO_DIR ADMIN_ADDRESS PULL_SERVICE_ADDRESS TOPIC GROUP
//
// The same steps as ../basalt-v1-python/client.py: create TOPIC (Admin),
// QueryRoute, 6 SendMessage to queue 0 of its first store-node, then through
// the pull-service alone QueryOffset, PullBatch (decode, max_bytes) and
// CommitOffset under the reset epoch until nothing is left; an admin reset;
// a commit under the old epoch. Prints one JSON object; exits 1 on a failure.
"use strict";

const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

// Between two and three of these records (~440 stored bytes each).
const MAX_BYTES = 1000;

const [protoDir, adminAddress, pullAddress, topic, group] = process.argv.slice(2);
const definition = loader.loadSync(
  ["basalt/v1/admin.proto", "basalt/v1/pull_service.proto", "basalt/v1/store_node.proto"],
  { includeDirs: [protoDir], keepCase: true, longs: Number, enums: String, defaults: true },
);
const v1 = grpc.loadPackageDefinition(definition).basalt.v1;
const insecure = grpc.credentials.createInsecure();
// A pull answer may carry a 4 MiB message: above gRPC's 4 MiB default receive.
const options = { "grpc.max_receive_message_length": 64 * 1024 * 1024 };

// A unary call as a promise, with a deadline.
function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 10000 }, (err, answer) =>
      err ? reject(err) : resolve(answer),
    );
  });
}

async function main() {
  const admin = new v1.Admin(adminAddress, insecure, options);
  const pull = new v1.PullService(pullAddress, insecure, options);
  await call(admin, "UpdateTopic", {
    config: { topic, read_queue_nums: 2, write_queue_nums: 2, perm: 6 },
  });
  let route;
  for (const start = Date.now(); !route; ) {
    try {
      route = (await call(pull, "QueryRoute", { topic })).route;
    } catch (err) {
      // The pull-service learns of the topic from etcd, soon after.
      if (err.code !== grpc.status.NOT_FOUND || Date.now() - start > 10000) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const broker = route.broker_datas[0];
  const store = new v1.StoreNode(broker.address, insecure, options);
  const sent = [];
  for (let i = 0; i < 6; i++) {
    const { result } = await call(store, "SendMessage", {
      message: {
        topic,
        body: Buffer.from(String(i).repeat(300)),
        tags: i % 2 === 0 ? "even" : "odd",
        keys: [`key-${i}`],
        properties: { n: String(i) },
      },
      queue_id: 0,
    });
    sent.push(result.offset_msg_ids[0]);
  }

  const queues = [0, 1].map((q) => ({ topic, broker_name: broker.broker_name, queue_id: q }));
  const positions = [];
  for (const queue of queues) {
    const got = await call(pull, "QueryOffset", { group, queue });
    positions.push({ offset: got.offset < 0 ? got.min_offset : got.offset, epoch: got.reset_epoch });
  }
  const received = [];
  const batches = [];
  for (;;) {
    const answer = await call(pull, "PullBatch", {
      group,
      pulls: queues.map((queue, q) => ({ queue, offset: positions[q].offset, max_nums: 32 })),
      decode: true,
      max_bytes: MAX_BYTES,
    });
    const count = answer.results.reduce((n, r) => n + r.messages.length, 0);
    if (count === 0) break;
    batches.push(count);
    for (const [q, result] of answer.results.entries()) {
      for (const m of result.messages) {
        received.push({
          msg_id: m.msg_id,
          queue_offset: m.queue_offset,
          tags: m.tags,
          keys: m.keys,
          n: m.properties.n,
          body_len: m.body.length,
        });
      }
      if (result.next_begin_offset !== positions[q].offset) {
        const { commit } = await call(pull, "CommitOffset", {
          group,
          queue: queues[q],
          offset: result.next_begin_offset,
          reset_epoch: positions[q].epoch,
        });
        if (commit.code !== "RESPONSE_CODE_SUCCESS") throw new Error(`commit: ${commit.code}`);
        positions[q].offset = result.next_begin_offset;
      }
    }
  }
  const committed = await call(pull, "QueryOffset", { group, queue: queues[0] });

  // Admin resets the group to the start: a commit under the epoch learned
  // before is refused, nothing stored.
  await call(admin, "ResetOffsetByTime", { group, topic, timestamp_ms: 0, force: true });
  const stale = await call(pull, "CommitOffset", {
    group,
    queue: queues[0],
    offset: 6,
    reset_epoch: positions[0].epoch,
  });
  const after = await call(pull, "QueryOffset", { group, queue: queues[0] });
  for (const client of [admin, pull, store]) client.close();
  return {
    sent,
    received,
    batches,
    committed: committed.offset,
    stale_code: stale.commit.code,
    offset_after_reset: after.offset,
    epoch_after_reset: after.reset_epoch,
    epoch_before_reset: positions[0].epoch,
    loaded: [],
  };
}

main().then(
  (seen) => console.log(JSON.stringify(seen)),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
