"""The ``apache.rocketmq.v2.MessagingService`` front: the official RocketMQ 5
clients' protocol, served by the pull-service (docs/rocketmq-v2.md)."""
