"""What the SDK, the CLI and the services all need (RocketMQ's ``common``).

By what each module imports, bottom up (no module imports one listed after it;
tests/test_imports.py holds the modules free of import cycles):

==================  ==============================================================
``settings``        stdlib: ``setting()``, the checks, ``validate()``, ``describe()``
``message``         stdlib: messages, properties, sysflags, hosts, message ids
``record``          ``message`` and the C extension ``_records``: the CommitLog
                    record codec, the one copy of the record layout (and its
                    in-place field reads)
``protowire``       protobuf's descriptors: protobuf framing by hand, written
                    and read back
``receipt``         stdlib: POP receipt handles
``status``          grpc's error type: the response-code metadata key, and
                    ``CodedError``, an error that carries its answer
``tracing``         the OpenTelemetry API: message trace context, span attributes
``tls``             grpc, ``settings``: ``TlsConfig``, server and channel credentials
``auth``            grpc: request signatures and the signing interceptors
``telemetry``       grpc, the OpenTelemetry API, ``settings``: logs, spans,
                    metrics; the OpenTelemetry SDK, its exporters and
                    prometheus_client only in what ``setup_telemetry`` runs
``dial``            ``tls``, ``auth``, ``telemetry``: the one channel factory
``local_cluster``   ``tls``, ``auth``: a local cluster's state file, and how a
                    CLI command finds an address, its TLS and its credentials
==================  ==============================================================

Never the engine (:mod:`basalt.store`), the services, the admin tools, the
pipeline or lark, so ``import basalt.client`` stays small
(tests/common/test_isolation.py holds it to that); the engine imports
``record``, ``message`` and ``settings`` only, which load no grpc, protobuf
or OpenTelemetry. The engine and the services import the same modules, so each
format is defined once.
"""
