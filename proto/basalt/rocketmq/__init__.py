"""Package ``basalt.rocketmq``: Apache RocketMQ's own gRPC contracts, vendored.

Basalt serves ``apache.rocketmq.v2.MessagingService`` (the protocol of the
official RocketMQ 5 clients) from ``basalt.services.rocketmq_v2``; see
docs/rocketmq-v2.md.
"""
