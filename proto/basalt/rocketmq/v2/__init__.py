"""Package ``basalt.rocketmq.v2``: apache/rocketmq-apis' ``apache/rocketmq/v2``
protos, vendored unchanged but for their import paths, and the modules
``scripts/generate_protos.py`` generates from them (do not edit the
``*_pb2*`` modules by hand).

Source: https://github.com/apache/rocketmq-apis at commit
3e60073c6dab3430feaec443824802e23ecda681 (Apache License 2.0, see ../LICENSE).
Files are compiled as ``basalt/rocketmq/v2/*.proto`` so they import as
``basalt.rocketmq.v2.*_pb2`` inside the one ``basalt`` package; the protobuf
package, and so the gRPC service name ``apache.rocketmq.v2.MessagingService``,
is unchanged. The official Python client registers the same message names in
protobuf's process-wide pool: never import it into a process that imports these.
"""
