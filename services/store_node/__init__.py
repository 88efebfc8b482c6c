"""The store-node process: one MessageStore behind the StoreNode gRPC service."""
